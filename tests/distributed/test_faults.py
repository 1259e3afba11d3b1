"""Faults injected into real torchrun groups (gloo, CPU): each is a row with its status and reason,
the matrix goes on, no finished cell is lost and no process of the run survives it. The run with
every in-rank fault is the ``faults`` fixture of tests/distributed/conftest.py (test_harness checks
its misbehaving strategies)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import psutil
import pytest

from bench.results.run import load_run
from bench.results.store import read_table
from tests.procs import saved

# Each case here waits out a cell timeout or a signal (~90 s together on 2 cores): `long`, run by .ci/run.
pytestmark = [pytest.mark.distributed, pytest.mark.long]


def leftovers(*needles: str) -> list[str]:
    """Running processes (not zombies) whose command line holds any of ``needles``."""
    out = []
    for p in psutil.process_iter(["cmdline", "status"]):
        if p.info["status"] == psutil.STATUS_ZOMBIE or p.pid == os.getpid():
            continue
        cmd = " ".join(p.info["cmdline"] or [])
        if any(n in cmd for n in needles):
            out.append(f"{p.pid}: {cmd[:120]}")
    return out


def no_leftovers(*needles: str, within_s: float = 5.0) -> list[str]:
    """Polls until no such process is left (or ``within_s`` passed); returns what is left."""
    end = time.monotonic() + within_s
    while True:
        left = leftovers(*needles)
        if not left or time.monotonic() > end:
            return left
        time.sleep(0.2)


def _row(cells: pd.DataFrame, strategy: str, workload: str = "mlp") -> pd.Series:
    rows = cells[(cells["strategy"] == strategy) & (cells["workload"] == workload)]
    assert len(rows) == 1, cells[["workload", "strategy", "status"]].to_string()
    return rows.iloc[0]


def test_rank_sigkill_names_rank_and_signal(faults):
    r = _row(faults[0], "test-killsrank")
    assert r["status"] == "failed"
    assert "rank 1" in r["reason"] and "SIGKILL" in r["reason"], r["reason"]
    assert "To enable traceback" not in r["reason"] and "error_file" not in r["reason"]


def test_hang_in_collective_is_a_timeout_and_the_sigterm_ignorer_is_killed(faults):
    r = _row(faults[0], "test-hangs-collective")
    assert r["status"] == "timeout", r["reason"]
    assert "cell_timeout_s=8" in r["reason"]
    # the rank that ignored SIGTERM was killed, and both the row and meta.json say so
    assert "killed with SIGKILL after ignoring SIGTERM: pid" in r["reason"], r["reason"]
    assert any("ignoring SIGTERM" in s for s in faults[1]["survivors"])


def test_oom_and_exceptions_keep_their_text_verbatim(faults):
    oom = _row(faults[0], "test-oom")
    assert oom["status"] == "failed"
    assert oom["reason"].startswith("rank 1: OutOfMemoryError: CUDA out of memory")
    assert "[/x] [bold]err == 0.[/]" in oom["reason"]
    raises = _row(faults[0], "test-raises")
    assert raises["status"] == "failed" and "deliberate failure in prepare" in raises["reason"]


def test_one_rank_failing_mid_collective_stops_the_group_before_the_cell_timeout(faults):
    r = _row(faults[0], "test-raises-midstep")
    assert r["status"] == "failed", r["reason"]
    assert r["reason"].startswith("rank 1: RuntimeError: deliberate failure in step 2"), r["reason"]
    # stopped after the grace (min(5 s, cell_timeout_s / 2) = 4 s here), not at the 8 s cell timeout
    assert "had not finished the cell 4s later" in r["reason"] and "group stopped" in r["reason"], r["reason"]
    assert "cell_timeout_s" not in r["reason"]


def test_broken_user_workload_fails_every_cell_with_its_message(faults):
    cells = faults[0]
    broken = cells[cells["workload"] == "broken-batches"]
    assert len(broken) >= 5
    ran = broken[broken["status"] != "skipped"]
    assert (ran["status"] == "failed").all()
    assert ran["reason"].str.contains("broken user data loader").all(), ran["reason"].tolist()


def test_matrix_goes_on_and_nothing_is_lost(faults):
    cells, meta, run_dir = faults
    assert _row(cells, "ddp")["status"] == "ok" and _row(cells, "single")["status"] == "ok"
    assert cells["cell_id"].is_unique and cells["status"].notna().all()
    assert meta["status"] == "complete" and meta["interrupted"] is False
    assert not list(run_dir.rglob("*.tmp")) and not list(run_dir.rglob(".*.tmp"))
    assert not no_leftovers(str(run_dir))  # (other runs share this machine: only this run's folder)


# --- The launcher itself is stopped or killed (the CLI in a subprocess).

def _start(tmp_path: Path, strategies: str, *extra: str) -> subprocess.Popen:
    """`parbench run` in a process of its own. World size 1: the faulty cell shares one torchrun with
    the reference (one start-up instead of two on a loaded machine); the kill paths are the same."""
    args = ["run", "--out", str(tmp_path), "--device", "cpu", "--backends", "gloo", "--world-sizes", "1",
            "--workloads", "mlp", "--strategies", strategies, "--steps", "2", "--warmup", "1", "--profile-steps",
            "0", "--sample-hz", "0", "--target-ci", "0", "--no-progress", *extra]
    return subprocess.Popen([sys.executable, "-m", "bench", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _wait_for_start(tmp_path: Path, strategy_cell: str, timeout: float = 150) -> Path:
    """The run folder, once rank 0 reported the start of the cell whose plan names ``strategy_cell``."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        for ev in tmp_path.glob("*/work/**/g*-a*-r0.jsonl"):
            plan = json.loads(Path(str(ev).rsplit("-r0.jsonl", 1)[0] + ".json").read_text())
            ids = {c["cell_id"] for c in plan["cells"] if c["strategy"] == strategy_cell}
            for line in ev.read_text().splitlines():
                if '"start"' in line and json.loads(line)["cell_id"] in ids:
                    return ev.parents[1] if ev.parent.name == "work" else ev.parents[2]
        time.sleep(0.2)
    raise AssertionError(f"cell {strategy_cell} never started")


@pytest.fixture(scope="module")
def hanging(tmp_path_factory) -> Iterator[dict[str, tuple[subprocess.Popen, Path]]]:
    """Two launchers started at once, each with a cell that hangs in prepare: the one the SIGTERM case
    stops and the one the SIGKILL case kills (on 2 cores their start-ups overlap instead of adding up)."""
    started: dict[str, tuple[subprocess.Popen, Path]] = {}
    try:
        for name in ("SIGTERM", "SIGKILL"):
            out = tmp_path_factory.mktemp(f"hanging-{name}")
            started[name] = (_start(out, "tests.helpers:Hangs", "--cell-timeout", "300"), out)
        yield started
    finally:
        for proc, _ in started.values():  # a case that failed before its signal
            if proc.poll() is None:
                proc.kill()
            proc.communicate()


# SIGHUP takes the same handler as SIGTERM (bench.runtime.signals.STOP_SIGNALS): the fast suite sends SIGTERM
@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), pytest.param(signal.SIGHUP, 129, marks=pytest.mark.slow)])
def test_parent_stop_signal_is_a_clean_interrupt(request, tmp_path, sig, code):
    if sig == signal.SIGTERM:
        proc, out = request.getfixturevalue("hanging")["SIGTERM"]
    else:
        proc, out = _start(tmp_path, "tests.helpers:Hangs", "--cell-timeout", "300"), tmp_path
    run_dir = _wait_for_start(out, "test-hangs")
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)  # a launcher that does not stop fails here
    assert proc.returncode == code, saved("stop-signal", err)
    assert "Traceback" not in err and f"interrupted by {sig.name}" in err
    meta = json.loads((run_dir / "meta.json").read_text())
    assert meta["interrupted"] is True and meta["status"] == f"interrupted by {sig.name}"
    assert (read_table(run_dir, "cells")["status"] == "ok").any()  # the reference cell before it is kept
    assert not no_leftovers(str(run_dir), within_s=5)


def test_parent_sigkill_leaves_no_process(hanging):
    proc, out = hanging["SIGKILL"]
    run_dir = _wait_for_start(out, "test-hangs")
    proc.kill()
    proc.wait(timeout=10)
    # The agent dies with the launcher and the ranks with the agent (bench.runtime.lifeline); the
    # ranks' watchdog sees the launcher gone too. tests/faults/test_run.py kills it at other moments.
    assert not no_leftovers(str(run_dir), within_s=5)


@pytest.mark.slow  # the fast suite kills a rank and the parent; the agent's death takes the same crash path
def test_torchrun_agent_sigkill_is_a_row_and_the_matrix_goes_on(tmp_path):
    proc = _start(tmp_path, "tests.helpers:Hangs,ddp", "--cell-timeout", "300")
    run_dir = _wait_for_start(tmp_path, "test-hangs")
    agents = [p for p in psutil.Process(proc.pid).children() if "torch.distributed.run" in " ".join(p.cmdline())]
    assert len(agents) == 1
    agents[0].kill()
    _, err = proc.communicate(timeout=150)
    assert proc.returncode == 0, saved("agent-sigkill", err)
    cells = read_table(run_dir, "cells").set_index("strategy")
    assert cells.loc["test-hangs", "status"] == "failed"
    assert "torchrun exited with signal 9 (SIGKILL)" in cells.loc["test-hangs", "reason"]
    assert cells.loc["ddp", "status"] == "ok" and cells.loc["single", "status"] == "ok"
    assert not no_leftovers(str(run_dir), within_s=5)


@pytest.mark.slow  # a run killed mid-cell, then resumed: two runs
def test_resume_runs_only_the_unfinished_cell_and_sets_aside_its_partial_rows(tmp_path):
    """A run killed after a cell's steps were written but before its row: --resume runs that cell
    alone, appends to the same folder, and its steps appear once. (A complete run is compacted to
    one part per table; PARBENCH_KEEP_PARTS keeps the parts, as a killed run leaves them.)"""
    os.environ["PARBENCH_KEEP_PARTS"] = "1"
    try:
        proc = _start(tmp_path, "ddp")
    finally:
        del os.environ["PARBENCH_KEEP_PARTS"]
    _, err = proc.communicate(timeout=150)
    assert proc.returncode == 0, saved("resume-first", err)
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    cells = read_table(run_dir, "cells")
    ddp = int(cells.loc[cells["strategy"] == "ddp", "cell_id"].iloc[0])
    for part in (run_dir / "cells.parquet").glob("part-*.parquet"):
        if pd.read_parquet(part)["cell_id"].tolist() == [ddp]:
            part.unlink()  # as if killed between the cell's steps part and its row
    r = subprocess.run([sys.executable, "-m", "bench", "run", "--resume", str(run_dir), "--no-progress"],
                       capture_output=True, text=True, timeout=150)
    assert r.returncode == 0, saved("resume", r.stdout, r.stderr)
    cells = read_table(run_dir, "cells")
    assert sorted(cells["cell_id"]) == sorted(set(cells["cell_id"])) and ddp in set(cells["cell_id"])
    assert (cells["status"] == "ok").all()
    steps = read_table(run_dir, "steps")
    timed = steps[(steps["cell_id"] == ddp) & (steps["phase"] == "timed")]
    assert not timed.duplicated(["rank", "repeat", "step"]).any()
    assert list((run_dir / "work" / "resume1" / "orphans").glob("steps-*"))
    meta = json.loads((run_dir / "meta.json").read_text())
    assert meta["status"] == "complete" and ddp not in meta["resumed"]
    _, _, loaded = load_run(run_dir)  # the folder still loads as one run
    assert loaded["run_id"] == run_dir.name


# --- serve and comm stopped by a signal: one line saying what was kept, no traceback

def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


# The serve case runs with the fault cases (`-m faults`, which .ci/run runs), the comm case only with
# `-m slow`: the README's suite keeps the training run's stop signals above, and its time under 10
# minutes on 2 cores.
@pytest.mark.parametrize("cmd, sig, kept", [
    pytest.param(["serve", "--device", "cpu", "--workload", "gpt-tiny", "--world-sizes", "2", "--rates", "5",
                  "--duration", "60", "--no-parity", "--sample-hz", "0"], signal.SIGTERM,
                 "the cells that finished are in", marks=pytest.mark.faults),
    pytest.param(["comm", "--device", "cpu", "--world-sizes", "2", "--max-bytes", "64M", "--iters", "200", "--budget",
                  "5"], signal.SIGINT, "the groups that finished are in", marks=pytest.mark.slow),
])
def test_serve_and_comm_stop_cleanly_on_a_signal(tmp_path, cmd, sig, kept):
    proc = subprocess.Popen([sys.executable, "-m", "bench", *cmd, "--out", str(tmp_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    end = time.monotonic() + 120
    kids: list[psutil.Process] = []
    while time.monotonic() < end and proc.poll() is None:  # until its worker processes are up
        kids = _descendants(proc.pid)
        if len(kids) >= 2:
            break
        time.sleep(0.3)
    assert proc.poll() is None and len(kids) >= 2, "the command never started its processes"
    time.sleep(3)
    kids = _descendants(proc.pid)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + sig, saved(f"{cmd[0]}-stop", err)
    assert "Traceback" not in err and f"interrupted by {sig.name}: {kept} {tmp_path}" in err
    gone, alive = psutil.wait_procs(kids, timeout=10)
    assert not [p for p in alive if p.status() != psutil.STATUS_ZOMBIE], alive
