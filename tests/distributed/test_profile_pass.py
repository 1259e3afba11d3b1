"""``--profile-at end``: the profiled steps run in a pass after every timed step of the process group
(no timed step follows a profiler session in its process), and a pass that fails or hangs costs the
cell its breakdown, never its timing. Real torchrun groups on gloo/CPU; the inline profile the pass
is compared with is the ``zoo`` run's (tests/distributed/conftest.py: every strategy, profiled inline)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from bench.results.run import load_run
from tests.distributed.runs import QUICK, ZOO_WORKLOAD
from tests.distributed.runs import run as run_folder

pytestmark = pytest.mark.distributed


def run(tmp_path, **flags) -> tuple[pd.DataFrame, Path]:
    """A run of gpt-tiny with no sampler and no steps past ``steps``: the order of passes is under
    test, not timing."""
    path = run_folder(tmp_path, **{"workloads": "gpt-tiny", "sample_hz": 0, "target_ci": 0, **flags})
    return load_run(path)[0], Path(path)


def events(run_dir: Path, group: str) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "work" / f"{group}-a1-r0.jsonl").read_text().splitlines()]


@pytest.mark.long  # a run of its own, with an adaptive warm-up (~25 s on 2 cores)
def test_profile_pass_comes_after_every_timed_step_and_fills_the_breakdown(tmp_path, zoo):
    # The warm-up settles here (no settle=0): the pass at the end repeats the warm-up the cell's first
    # repeat needed, and after a single warm-up step ddp's pass records 2 all-reduces a step where
    # the inline profile, after the timed steps, records 1.
    end, run_dir = run(tmp_path / "end", workloads=ZOO_WORKLOAD, strategies="ddp,fsdp", world_sizes="2", steps=3,
                       warmup=1, repeats=2, profile_at="end")
    # inline (the CPU default): every ok cell of the zoo, every strategy at 2 and 4 on the same workload
    inline = zoo[zoo["status"] == "ok"]
    for cells in (end, inline):
        assert (cells["status"] == "ok").all(), cells[["strategy", "status", "reason"]]
        assert cells["compute_time_s"].notna().all() and cells["profiled_step_s"].notna().all()
        assert cells["profile_note"].isna().all()
        # beside each profiled step, the same pass's steps just before it, without the profiler
        assert cells["unprofiled_step_s"].gt(0).all()
    assert set(end["profile_at"]) == {"end"} and set(inline["profile_at"]) == {"inline"}
    # the same communication evidence either way (what the distribution check reads)
    by_end, by_inline = end.set_index("strategy"), inline[inline["world_size"] == 2].set_index("strategy")
    for name in ("ddp", "fsdp"):
        assert by_end.loc[name, "comm_calls_per_step"] == by_inline.loc[name, "comm_calls_per_step"] > 0
    # in the two-rank group, every pass starts after the last timed repeat, one pass per cell
    ev = events(run_dir, "g1")
    kinds = [(e["event"], e.get("repeat")) for e in ev if e["event"] in ("start", "measured", "profiled")]
    last_measured = max(i for i, (k, _) in enumerate(kinds) if k == "measured")
    passes = [i for i, (k, r) in enumerate(kinds) if k == "start" and r == -1]
    assert len(passes) == 2 and min(passes) > last_measured
    assert sum(k == "profiled" for k, _ in kinds) == 2
    comm = pd.read_parquet(run_dir / "comm.parquet")
    assert set(comm["cell_id"]) >= set(end.loc[end["world_size"] == 2, "cell_id"])


@pytest.fixture(scope="module")
def faulty(tmp_path_factory) -> tuple[pd.DataFrame, Path]:
    """Four cells in one group: A raises in its profile pass, B hangs in it, ddp is fine, C hangs in
    its timed repeat. C's hang (before any pass) kills the launch: C is the timeout, and A, B and
    ddp, timed already, are neither blamed nor dropped; the relaunches run only passes."""
    return run(tmp_path_factory.mktemp("faulty"), strategies="tests.helpers:RaisesWhenProfiled,"
               "tests.helpers:HangsWhenProfiled,ddp,tests.helpers:Hangs", world_sizes="2", steps=3, warmup=1,
               profile_at="end", cell_timeout_s=10, **QUICK)


@pytest.mark.slow  # a four-cell run with failing and hanging passes (the fast suite: order, breakdown)
def test_a_failing_or_hanging_profile_pass_keeps_the_timing(faulty):
    cells, _ = faulty
    by = cells.set_index("strategy")
    raised, hung = by.loc["test-raises-when-profiled"], by.loc["test-hangs-when-profiled"]
    for row in (raised, hung):
        assert row["status"] == "ok" and row["step_time_median_s"] > 0 and row["parity_ok"]
        assert pd.isna(row["compute_time_s"])  # no breakdown: the pass gave none
        assert row["comm_calls_per_step"] > 0  # the first repeat's CPU-side evidence step
    assert raised["profile_note"].startswith("profile pass failed on rank")
    assert "deliberate failure in the profile pass" in raised["profile_note"]
    assert hung["profile_note"].startswith("profile pass did not finish")


@pytest.mark.slow  # a four-cell run with failing and hanging passes (the fast suite: order, breakdown)
def test_a_hang_in_a_timed_repeat_or_in_a_pass_costs_only_that_cell(faulty):
    """C's timed hang is C's timeout alone; ddp's pass, in a relaunch after B's hung pass, fills
    ddp's breakdown; no timed repeat runs twice over the launches of the group."""
    cells, run_dir = faulty
    by = cells.set_index("strategy")
    assert by.loc["test-hangs", "status"] == "timeout"
    ddp = by.loc["ddp"]
    assert ddp["status"] == "ok" and ddp["compute_time_s"] > 0 and pd.isna(ddp["profile_note"])
    # the relaunches ran no timed repeat again: one Measured per cell over all launches of the group
    measured = [json.loads(x) for f in (run_dir / "work").glob("g1-a*-r0.jsonl")
                for x in f.read_text().splitlines() if '"measured"' in x]
    assert sorted(m["cell_id"] for m in measured) == sorted(set(m["cell_id"] for m in measured))


@pytest.mark.long
def test_a_one_rank_cell_records_no_communication(tmp_path):
    # DDP over one rank still calls all_reduce (a no-op): the cell has no calls, bytes or comm rows,
    # and the time those calls took counts as the step's compute; its two-rank twin keeps its calls.
    cells, run_dir = run(tmp_path, strategies="ddp", world_sizes="1,2", steps=3, warmup=1)
    ddp = cells[cells["strategy"] == "ddp"].set_index("world_size")
    assert (ddp["status"] == "ok").all(), ddp[["status", "reason"]]
    assert ddp.loc[1, "comm_calls_per_step"] == 0 and ddp.loc[1, "comm_bytes_per_step"] == 0
    assert ddp.loc[1, "comm_time_s"] == 0 and ddp.loc[1, "exposed_comm_s"] == 0
    assert ddp.loc[1, "compute_time_s"] > 0
    assert ddp.loc[2, "comm_calls_per_step"] > 0 and ddp.loc[2, "comm_time_s"] > 0
    comm = pd.read_parquet(run_dir / "comm.parquet")
    assert int(ddp.loc[1, "cell_id"]) not in set(comm["cell_id"])
    assert int(ddp.loc[2, "cell_id"]) in set(comm["cell_id"])


@pytest.mark.long  # a run of its own per placement (about 24 s on 2 cores)
@pytest.mark.parametrize("profile_at", ["end", "inline"])
def test_a_profile_pass_far_from_the_timed_step_runs_again(tmp_path, profile_at):
    """The profiler slows one cell's first timing pass by 0.25 s a step and another's every pass:
    the first runs a second pass and keeps it (its breakdown describes the timed step), the second
    stops after PROFILE_PASSES (on each build that profiles, up to PROFILE_BUILDS, when deferred),
    keeps its closest and is flagged, never explained from."""
    from bench.decide.rules import breakdown_off
    from bench.train.profile import PROFILE_BUILDS, PROFILE_PASSES

    cells, _ = run(tmp_path, strategies="tests.helpers:SlowFirstProfiled,tests.helpers:SlowProfiled,ddp",
                   world_sizes="2", steps=3, warmup=1, profile_at=profile_at)
    by = cells.set_index("strategy")
    assert (by["status"] == "ok").all(), by[["status", "reason"]]
    once, always = by.loc["test-slow-first-profiled"], by.loc["test-slow-profiled"]
    slowed = lambda r: 0.25 / r["step_time_median_s"]  # about the gap of a slowed pass
    assert once["profile_passes"] >= 2 and once["breakdown_gap"] < slowed(once) / 2
    assert always["breakdown_gap"] > slowed(always) / 2
    if profile_at == "inline":  # one build: its passes
        assert always["profile_passes"] == PROFILE_PASSES
    else:  # every build's passes off: built again, up to PROFILE_BUILDS; each that profiles runs its passes
        assert always["profile_builds"] == PROFILE_BUILDS
        assert PROFILE_PASSES <= always["profile_passes"] <= PROFILE_PASSES * PROFILE_BUILDS
    assert breakdown_off(always) is not None
    most = PROFILE_PASSES if profile_at == "inline" else PROFILE_PASSES * PROFILE_BUILDS
    assert 1 <= by.loc["ddp", "profile_passes"] <= most


@pytest.mark.long  # a run of its own, built twice (about 40 s on 2 cores)
def test_a_profile_build_off_the_timed_step_is_built_again(tmp_path):
    """One cell's build for its profile pass steps 0.1 s slower than its timed repeat's, another's
    every later build does, and a third's first profiling build is slowed 0.25 s a step under the
    profiler only: the first is built again and its breakdown describes the timed step; the
    second stops at PROFILE_BUILDS and says its build ran off before any profiling; the third is
    built again after all its passes were off, and keeps a pass of a later build."""
    from bench.decide.rules import breakdown_off, rebuild_off
    from bench.train.profile import PROFILE_BUILDS, PROFILE_PASSES

    cells, _ = run(tmp_path, strategies="tests.helpers:SlowSecondBuild,tests.helpers:SlowBuilds,"
                   "tests.helpers:SlowProfiledBuild", world_sizes="2", steps=3, warmup=1, profile_at="end")
    by = cells.set_index("strategy")
    assert (by["status"] == "ok").all(), by[["status", "reason"]]
    again, always = by.loc["test-slow-second-build"], by.loc["test-slow-builds"]
    slowed = lambda r, s: s / r["step_time_median_s"]  # about the gap of a build slowed s seconds a step
    # built again once, or twice where the next build was off too on a busy host; kept from a build
    # that steps at the timed speed
    assert again["profile_builds"] >= 2 and abs(again["breakdown_gap"]) < slowed(again, 0.1) / 4
    assert abs(rebuild_off(again) or 0.0) < slowed(again, 0.1) / 4
    assert always["profile_builds"] == PROFILE_BUILDS and always["breakdown_gap"] > slowed(always, 0.1) / 2
    assert breakdown_off(always) is not None and rebuild_off(always) is not None
    passes = by.loc["test-slow-profiled-build"]
    assert passes["profile_builds"] >= 2 and passes["profile_passes"] > PROFILE_PASSES
    assert abs(passes["breakdown_gap"]) < slowed(passes, 0.25) / 4


@pytest.mark.long
def test_a_profile_pass_keeps_its_closest_pass_over_builds(tmp_path):
    """Every build of the cell's profile pass is off under the profiler, the first by 0.25 s a step
    and the later ones by 0.5 s: it runs its passes on PROFILE_BUILDS builds and keeps the first's."""
    from bench.train.profile import PROFILE_BUILDS

    cells, _ = run(tmp_path, strategies="tests.helpers:SlowerProfiledBuilds", world_sizes="2", steps=3, warmup=1,
                   profile_at="end")
    r = cells.set_index("strategy").loc["test-slower-profiled-builds"]
    assert r["status"] == "ok", r["reason"]
    assert r["profile_builds"] == PROFILE_BUILDS
    near, far = 0.25 / r["step_time_median_s"], 0.5 / r["step_time_median_s"]
    assert abs(r["breakdown_gap"] - near) < abs(r["breakdown_gap"] - far), (r["breakdown_gap"], near, far)
