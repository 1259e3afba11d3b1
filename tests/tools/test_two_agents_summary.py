"""The two-agents device script's replay (SUMMARY_ONLY=1): over rounds measured in separate calls and
merged into one folder, it prints one row per (strategy, world size) with every round, and it names
the card the runs recorded (this machine has none). Input: rounds 2 and 3 of the two-agent runs on 4 H100s
(gpt-200m, global batch 64), one call each, cut to the cells, meta.json and NCCL's channel lines."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tools" / "device" / "two_agents.sh"
CALLS = ROOT / "tests" / "fixtures" / "two-agents"
pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def replay(out: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "SUMMARY_ONLY": "1", "PYTHON": sys.executable, "PYTHONPATH": str(ROOT)}
    return subprocess.run(["bash", str(SCRIPT), str(out)], capture_output=True, text=True, env=env, timeout=120)


def test_summary_only_without_rounds_is_a_one_line_error(tmp_path):
    res = replay(tmp_path / "nothing")
    assert res.returncode == 2 and "no one/ rounds" in res.stderr and "Traceback" not in res.stderr
    assert not (tmp_path / "nothing").exists()  # nothing created, nothing removed


@pytest.mark.slow  # replays two calls' rounds
def test_summary_only_replays_rounds_of_two_calls(tmp_path):
    merged = tmp_path / "two-agents"
    for call in ("call-r2", "call-r3"):
        src = CALLS / call
        for sub in ("one", "two-2", "two-4"):
            for r in (src / sub).iterdir():
                shutil.copytree(r, merged / sub / r.name)
    res = replay(merged)
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert "card: NVIDIA H100 80GB HBM3" in out and "rounds: 2" in out
    rows = [line for line in out.splitlines() if line.startswith(("| ddp |", "| fsdp |"))]
    assert len(rows) == 4
    # each row holds both rounds' medians, e.g. '| ddp | 2 | 146.58, 146.66 | ...'
    assert all(len(row.split("|")[3].split(",")) == 2 for row in rows)
    assert "| ddp | 2 | 146.58, 146.66 | 146.33, 147.18 |" in out  # the fixture's rounds 2 and 3
    assert all("P2P/CUMEM" in row for row in rows)  # the transport between the agents, from the ranks' logs
    assert (merged / "one" / "r2").is_dir()  # the replay removed nothing
