"""Adaptive repeats without processes: which open decisions ask for repeats, what fits the time
left, when a run is adaptive, and how a cell's later row supersedes its earlier one."""

from __future__ import annotations

import dataclasses

import pandas as pd
import pytest

from bench.core.config import build_config
from bench.core.spec import CellSpec, Measure, RankMeasurement, WorkloadFacts
from bench.decide.decision import Decision, DecisionKind
from bench.decide.rules import MAX_REPEATS
from bench.plan.budget import GROUP_START_S
from bench.results.store import RunWriter, latest_rows, read_table
from bench.train.adaptive import (
    CACHED_COMPILE_SHARE,
    MIN_CAP_S,
    ROUND_REPEATS,
    Ask,
    asks,
    fit,
    fit_every,
    launch_cost,
    repeat_parts,
    round_cap,
)
from bench.train.launcher import adaptive
from bench.train.pending import Pending


def spec(cid: int, strategy: str, n_procs: int, backend: str = "nccl", profile_at: str = "end") -> CellSpec:
    facts = WorkloadFacts(name="gpt", spec="gpt", dims={}, global_batch=16, params=1000, flops_per_sample=1.0,
                          n_blocks=4, n_heads=4, has_tp_plan=True, description="")
    m = Measure(steps=5, warmup=2, profile_steps=2, precision="bf16", seed=0,
                profile_at=profile_at)
    return CellSpec(cell_id=cid, workload=facts, strategy=strategy, strategy_spec=strategy, backend=backend,
                    device="cuda", n_devices=n_procs, n_procs=n_procs, devices=tuple(range(n_procs)), options={},
                    labels={}, role="", measure=m, scaling="strong", nnodes=1)


def pending(cid: int, strategy: str, n_procs: int, repeats: int = 1, wall: float = 4.0) -> Pending:
    return Pending(spec=spec(cid, strategy, n_procs), repeats=[[]] * repeats, repeat_wall_s=[wall] * repeats)


def open_pick(cells: tuple[int, ...], need: int | None = 3, launch_bound: bool = False, ws: int = 2) -> Decision:
    return Decision(workload="gpt", backend="nccl", world_size=ws, winner="ddp", step_ms=50.0, runner_up=None,
                    candidates=2, use="ddp", kind=DecisionKind.LIBRARY, resolved=False, open_cells=cells,
                    repeats_needed=need, launch_bound=launch_bound)


def test_asks_take_open_decisions_that_repeats_can_close():
    kept = {0: pending(0, "single", 1), 1: pending(1, "ddp", 2), 2: pending(2, "fsdp", 2, repeats=3)}
    picks = [open_pick((1, 0)), open_pick((1, 2), need=None),  # more repeats than worth it: left alone
             dataclasses.replace(open_pick((0,)), resolved=True)]
    (a,) = asks(picks, kept)
    assert a.targets == {1: 3, 0: 3}  # from one repeat to the 3 an interval from repeats needs
    assert a.cost() == pytest.approx(2 * 4.0 + 2 * 4.0)
    more = asks([open_pick((2,))], kept)[0]
    assert more.targets == {2: 3 + ROUND_REPEATS}


def test_asks_put_real_workloads_before_launch_bound_ones():
    kept = {i: pending(i, "ddp", 2, wall=1.0 if i < 2 else 9.0) for i in range(4)}
    order = asks([open_pick((0, 1), launch_bound=True), open_pick((2, 3))], kept)
    assert [a.pick.launch_bound for a in order] == [False, True]


def test_fit_counts_repeats_and_process_starts():
    kept = {0: pending(0, "single", 1), 1: pending(1, "ddp", 2), 2: pending(2, "ddp", 4), 3: pending(3, "ddp", 4)}
    wanted = asks([open_pick((1, 0)), open_pick((2, 3), ws=4)], kept)
    start = GROUP_START_S["cuda"]
    assert launch_cost([], "cuda") == start
    assert launch_cost([{"start_s": 20.0, "teardown_s": 4.0}, {"start_s": 30.0}, {"group": "x"}], "cuda") == 27.0
    # the first ask: 16 s of repeats and two process groups (1 and 2 ranks), with a 25% margin
    first = 1.25 * (16 + 2 * start)
    assert fit(wanted, kept, 1.25 * (16 + start) - 1, start) == {}
    # an ask that does not fit is passed over for a later one that does (one group of 4 ranks)
    assert fit(wanted, kept, first - 1, start) == {2: 3, 3: 3}
    assert fit(wanted, kept, first + 1, start) == {1: 3, 0: 3}
    both = 1.25 * (32 + 3 * start)
    assert fit(wanted, kept, both + 1, start) == {1: 3, 0: 3, 2: 3, 3: 3}


def test_a_round_that_cannot_fit_every_slots_three_measures_every_slots_two():
    """Three slots, each asking for its last three cells (or its last two): when the time left fits
    two slots' three but all three slots' two, every slot gets its two; when it fits them all, or
    the narrow asks cover no more slots, the wide ones stand."""
    kept = {i: pending(i, "single", 1, wall=2.0) for i in range(9)}
    wide = asks([open_pick((0, 1, 2), ws=1), open_pick((3, 4, 5), ws=1), open_pick((6, 7, 8), ws=1)], kept)
    narrow = asks([open_pick((0, 1), ws=1), open_pick((3, 4), ws=1), open_pick((6, 7), ws=1)], kept)
    start = 5.0
    # a slot's three: 3 cells x 2 repeats x 2 s = 12 s; its two: 8 s; one process group for all
    two_of_three = 1.25 * (24 + start) + 1
    assert set(fit(wide, kept, two_of_three, start)) == {0, 1, 2, 3, 4, 5}  # the third slot left out
    assert set(fit_every(wide, narrow, kept, two_of_three, start)) == {0, 1, 3, 4, 6, 7}
    every = 1.25 * (36 + start) + 1
    assert set(fit_every(wide, narrow, kept, every, start)) == set(range(9))
    assert set(fit_every(wide, narrow[:1], kept, two_of_three, start)) == {0, 1, 2, 3, 4, 5}
    assert fit_every(wide, [], kept, 1.0, start) == {}


def test_a_slot_whose_two_need_nothing_does_not_tip_the_choice_to_its_three():
    """The third slot's fastest two have every repeat (MAX_REPEATS) and only its third cell asks, so
    the wide list has three asks and the narrow one two. The wide round that fits measures the
    first and third slots' three and leaves the second slot's two to the noise; the narrow round
    measures both slots' two, and is the one taken (counting each list's own asks ties at two)."""
    kept = {i: pending(i, "single", 1, wall=2.0) for i in range(9)}
    kept |= {i: pending(i, "single", 1, repeats=MAX_REPEATS, wall=2.0) for i in (6, 7)}
    wide = [asks([open_pick(cells, ws=1)], kept)[0] for cells in ((0, 1, 2), (3, 4, 5), (6, 7, 8))]
    narrow = [asks([open_pick(cells, ws=1)], kept)[0] for cells in ((0, 1), (3, 4))]
    assert not asks([open_pick((6, 7), ws=1)], kept)
    # one slot's three: 12 s; the third slot's one cell: 4 s; a slot's two: 8 s; one process group.
    # In order the wide asks fit the first slot and (past the second's 12 s) the third's 4 s.
    start = 5.0
    left = 1.25 * (16 + start) + 1
    assert set(fit(wide, kept, left, start)) == {0, 1, 2, 8}
    assert set(fit_every(wide, narrow, kept, left, start)) == {0, 1, 3, 4}


def test_again_keeps_the_repeats_and_a_profile_pass_only_behind_a_breakdown():
    p = pending(1, "ddp", 2)
    q = p.again(3)
    assert q.spec.measure.repeats == 3 and len(q.repeats) == 1 and not q.timed()
    assert p.awaits_pass and not q.awaits_pass  # no breakdown to hold it to: none again
    q.repeats.append([])
    assert len(p.repeats) == 1  # the earlier state is not shared
    # with a breakdown (rank 1's profiled step the slower), a pass may come: the worker decides
    p = Pending(spec=spec(1, "ddp", 2), repeats=[[
        RankMeasurement(rank=0, times=[0.10, 0.30, 0.12], breakdown={"profiled_step_s": 0.11}, warmup_steps=9),
        RankMeasurement(rank=1, times=[0.20, 0.10, 0.11], breakdown={"profiled_step_s": 0.13}, warmup_steps=14)]])
    assert p.span() == 0.13 and p.again(3).awaits_pass
    assert p.steps() == [[0.20, 0.30, 0.12]]  # each step's slowest rank
    assert p.settled() == 14 and q.settled() is None  # its pass warms up as its first repeat did
    assert not Pending(spec=spec(1, "ddp", 2, profile_at="first"), repeats=p.repeats).again(3).awaits_pass


def test_a_run_is_adaptive_under_a_budget_unless_told_or_repeats_given():
    def cfg(**flags):
        return build_config(toml=None, gpus=0, flags={"device": "cpu", **flags})
    assert adaptive(cfg(budget="5m"))
    assert adaptive(cfg())  # the CPU default's budget
    assert not adaptive(cfg(budget="off"))  # no budget: nothing to pace by
    assert not adaptive(cfg(budget="5m", adaptive=False))
    assert not adaptive(cfg(budget="5m", repeats=5))  # the user chose how many


def test_a_later_row_with_more_repeats_supersedes_the_earlier(tmp_path):
    w = RunWriter(tmp_path / "run")
    w.append("cells", [{"cell_id": 0, "strategy": "single", "status": "ok", "repeats_done": 1},
                       {"cell_id": 1, "strategy": "ddp", "status": "ok", "repeats_done": 1}])
    w.append("cells", [{"cell_id": 1, "strategy": "ddp", "status": "ok", "repeats_done": 3}])
    got = read_table(w.dir, "cells")
    assert list(got["cell_id"]) == [0, 1] and list(got["repeats_done"]) == [1, 3]
    w.compact()
    assert list(read_table(w.dir, "cells")["repeats_done"]) == [1, 3]
    # the row with the most repeats wins whatever order the parts are read in
    df = pd.DataFrame({"cell_id": [1, 1, 2], "repeats_done": [5, 3, 1]})
    assert list(latest_rows(df)["repeats_done"]) == [5, 1]


def test_a_round_shortens_its_repeats_to_fit_rather_than_drop_them():
    # two cells, 2 repeats each to add; a repeat: 3 s outside its timed steps, 20 s timed (the screening's cap)
    a = Ask(pick=open_pick((0, 1)), targets={0: 3, 1: 3}, slots=((2, 3.0, 20.0), (2, 3.0, 20.0)))
    assert a.cost() == pytest.approx(92.0) and a.cost(5.0) == pytest.approx(32.0)
    assert round_cap([a], 1000.0, 10.0, 20.0) == 20.0  # fits as screened
    cap = round_cap([a], 100.0, 10.0, 20.0)  # 100 s left: (100 / 1.25 - 12 - 30) / 4
    assert cap == pytest.approx(9.5)
    assert round_cap([a], 30.0, 10.0, 20.0) == MIN_CAP_S  # never shorter than this
    assert round_cap([a], 100.0, 10.0, None) is None  # no cap to lower
    p = pending(0, "ddp", 2)
    q = p.again(3, time_cap_s=cap)
    assert q.spec.measure.time_cap_s == cap and p.spec.measure.time_cap_s == 0.0


def test_a_cell_measured_again_is_profiled_again_only_when_its_median_moved():
    from types import SimpleNamespace

    import numpy as np

    from bench.train.worker import GroupLoop

    loop = GroupLoop(plan=SimpleNamespace(held={"1": 0.40}), rank=0, local_rank=0, leader=False, events=None)
    # its earlier repeats and this launch's together: the median of the repeat medians from 3 on
    loop.timed = {1: [np.array([0.40, 0.42]), np.array([0.42]), np.array([0.43])], 2: [np.array([0.50])]}
    one = SimpleNamespace(cell_id=1)
    assert not loop.wants_pass(one)  # 0.40 held to 0.42: -4.8%, its breakdown stands
    loop.timed[1] += [np.array([0.47]), np.array([0.48]), np.array([0.49]), np.array([0.50])]
    assert loop.wants_pass(one)  # to 0.47: -14.9%, profiled again
    assert loop.wants_pass(SimpleNamespace(cell_id=2))  # nothing held: its first pass


def test_a_compiled_cell_asked_again_is_charged_its_cached_compile_not_its_first():
    # one repeat of 30 s wall, 3 s of timed steps, 21 s of which compiled: a new process finds its
    # graphs in the on-disk caches, so a further repeat costs its 6 s plus a share of the compile
    first = [RankMeasurement(rank=0, times=[1.0, 1.0, 1.0], compile_s=21.0)]
    p = Pending(spec=spec(1, "single", 1), repeats=[first], repeat_wall_s=[30.0])
    assert repeat_parts(p) == (27.0, 3.0)  # what a like cell compiles anew: its whole wall
    fixed, timed = repeat_parts(p, again=True)
    assert timed == 3.0 and fixed == pytest.approx(6.0 + 21.0 * CACHED_COMPILE_SHARE)
    # with later repeats, their own compile seconds
    later = [RankMeasurement(rank=0, times=[1.0, 1.0, 1.0], compile_s=1.0)]
    p2 = Pending(spec=spec(1, "single", 1), repeats=[first, later, later], repeat_wall_s=[30.0, 10.0, 10.0])
    assert repeat_parts(p2, again=True) == (pytest.approx(7.0), 3.0)  # 10 s a later repeat, 1 s compiling
    # an eager cell is charged as before
    eager = Pending(spec=spec(1, "single", 1), repeats=[[RankMeasurement(rank=0, times=[1.0, 1.0])]],
                    repeat_wall_s=[8.0])
    assert repeat_parts(eager, again=True) == repeat_parts(eager) == (6.0, 2.0)
