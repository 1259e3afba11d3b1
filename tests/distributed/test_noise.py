"""Noise handling on real gloo runs: repeats interleave, a time budget is planned, a slow rank and a
contended host are named."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from bench.core.config import build_config
from bench.results.run import load_run
from bench.train import launcher as launch
from tests.procs import saved

pytestmark = [pytest.mark.distributed, pytest.mark.long]  # a run of its own: 10 s of setup on 2 cores


def run(tmp_path, **flags):
    flags = {"out": str(tmp_path), "device": "cpu", "backends": "gloo", "sample_hz": 20, "profile_steps": 0, **flags}
    cfg = build_config(toml=None, flags=flags, gpus=0)
    d = launch.run(cfg, 0)
    cells, steps, meta = load_run(d)
    return cells, steps, meta


def test_repeats_run_in_balanced_rounds_and_every_repeat_is_kept(one_rank_rounds):
    """single, ddp and allreduce at world size 1, 3 repeats of 3 steps (tests/distributed/conftest.py;
    test_telemetry checks the same run's samples)."""
    cells, steps, _ = load_run(one_rank_rounds)
    ok = cells[cells["status"] == "ok"]
    assert len(ok) == 3 and (ok["repeats_done"] == 3).all() and ok["ci_basis"].str.startswith("repeats").all()
    first = steps[steps["phase"] == "timed"].groupby(["repeat", "cell_id"])["t_unix"].min().reset_index()
    order = first.sort_values("t_unix")
    # round k of every cell before round k+1 of any: drift lands on every cell alike
    assert order["repeat"].is_monotonic_increasing, order
    orders = [tuple(g.sort_values("t_unix")["cell_id"]) for _, g in first.groupby("repeat")]
    # 3 cells of one group, 3 rounds: each cell ran first, second and last once (a Latin square's rows)
    assert all(sorted(col) == sorted(orders[0]) for col in zip(*orders)), orders
    # and the orders are the ones the group's plan gives (bench.train.rounds.rounds, seeded): a
    # second run of the same plan runs them again
    from bench.core import spec
    from bench.train.rounds import rounds

    plan = spec.load(spec.GroupPlan, (one_rank_rounds / "work" / "g0-a1.json").read_text())
    assert orders == [tuple(c.cell_id for c, _ in r) for r in rounds(plan)]


@pytest.mark.slow  # a budgeted run; the budget plan's arithmetic has unit tests (tests/unit/test_plan.py)
def test_a_time_budget_is_planned_and_recorded(tmp_path):
    """What the plan decided, and what meta.json records of it; how long the run took is not
    checked (the machine's load decides that; tests/unit/test_plan.py covers the pacer's arithmetic)."""
    # --steps-max 4 bounds each repeat whatever its cap: the budget is far from reached on a loaded
    # machine (no cell is cut at the deadline), and the run takes its start-ups and a few steps
    cells, _, meta = run(tmp_path, workloads="mlp", strategies="single,ddp", world_sizes="1,2", repeats=3,
                         steps=2, steps_max=4, budget="180s", search="off")
    # 3 cells (single and ddp at 1, ddp at 2) in 2 groups: 144 s usable less 2 x 4 s start-up and
    # 3 x 1 s per cell leaves 133 s, 14.8 s for each of the 9 repeats
    assert meta["plan"].startswith(
        "budget 180s: 3 cells x 3 repeat(s) in 2 process group(s); "
        "each repeat times at least 2 steps and stops adding steps after 14.8s"), meta["plan"]
    assert "kept as given: profile_steps, repeats, steps, steps_max" in meta["plan"], meta["plan"]
    assert (cells["status"] == "ok").all(), cells[["strategy", "status", "reason"]]
    # each process group ran under a cap drawn from the time left before it (bench.plan.budget.Pacer):
    # at least 0.1 s and at most twice the plan's
    ran = cells[cells["status"] == "ok"]
    assert ran["time_cap_s"].notna().all() and ran["time_cap_s"].between(0.1, 2 * 133 / 9).all(), ran["time_cap_s"]
    assert ran.groupby(["nproc", "backend"])["time_cap_s"].nunique().eq(1).all()  # one cap a group
    assert (ran["repeats_done"] == 3).all()
    # where each group's start-up went, for the next budget's cost model (meta.json group_starts)
    starts = meta["group_starts"]
    assert [s["group"] for s in starts] == ["gloo x1", "gloo x2"], starts
    for s in starts:
        assert {"torchrun_s", "imports_s", "process_group_s", "warm_up_s", "start_s", "teardown_s"} <= set(s), s
        assert 0 < s["imports_s"] < s["start_s"] and 0 <= s["teardown_s"], s
    # and the command's last line says how the budget was used
    import io
    from contextlib import redirect_stdout
    from pathlib import Path

    from bench.cli.run import print_budget_use

    out = io.StringIO()
    with redirect_stdout(out):
        print_budget_use(Path(tmp_path) / meta["run_id"])
    line = out.getvalue().strip()
    assert line.startswith("budget 180s: the run took ") and f"{int((cells['status'] == 'ok').sum())} cells measured" \
        in line and "2 process group start-ups took" in line, line


@pytest.mark.slow  # runs with an injected slow rank or load; the flags' logic has unit tests
def test_a_slow_rank_is_named(tmp_path):
    cells, _, _ = run(tmp_path, workloads="mlp", strategies="tests.helpers:SlowRank", world_sizes="2", steps=8,
                      warmup=1, target_ci=0, sample_hz=0)
    row = cells.set_index("strategy").loc["test-slowrank"]
    assert row["slow_rank"] == 1 and not row["stable"] and "rank 1 slow" in row["noise"]


@pytest.mark.slow  # runs with an injected slow rank or load; the flags' logic has unit tests
def test_a_contended_host_is_flagged(tmp_path):
    """Two busy loops outside the benchmark's process tree (as another job on the host is: the run
    is a `parbench run` process of its own, not this test's) are seen as contention."""
    hog = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        time.sleep(1.0)
        r = subprocess.run([sys.executable, "-m", "bench", "run", "--out", str(tmp_path), "--device", "cpu",
                            "--backends", "gloo", "--workloads", "mlp", "--strategies", "single", "--world-sizes",
                            "1", "--steps", "30", "--warmup", "2", "--target-ci", "0", "--profile-steps", "0",
                            "--sample-hz", "20", "--no-progress"], capture_output=True, text=True, timeout=300)
    finally:
        for p in hog:
            p.kill()
            p.wait()
    assert r.returncode == 0, saved("contended", r.stdout, r.stderr)
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    row = load_run(run_dir)[0].iloc[0]
    assert row["status"] == "ok" and row["contended"], row[["contended", "host_other_cpu_cores", "host_load1"]]
    assert not row["stable"] and "contended" in row["noise"]
    assert row["host_other_cpu_cores"] >= 0.5
