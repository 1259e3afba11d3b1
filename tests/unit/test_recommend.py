"""The recommendation rules (bench.decide.recommend) on hand-built cells, one table per rule, and on
cells recorded on H100s (tests/fixtures/recommend/): the decisions as values (their kind, the pairs
they judged, what blocks them, the fit, the cells still open). Their sentences: test_words.py."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pandas as pd
import pytest

from bench.decide.decision import (
    Against,
    BlockerKind,
    BoundKind,
    DecisionKind,
    ExcludedKind,
    Ground,
    PartKind,
    TipKind,
    Verdict,
    decisions_from_json,
    decisions_to_json,
)
from bench.decide.recommend import first_screen, recommend
from reports import words

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "recommend"
GB = 16
GIB = 2**30
OOM = ("rank 0: OutOfMemoryError: CUDA out of memory. Tried to allocate 3.00 GiB. GPU 0 has a total capacity of "
       "79.11 GiB of which 1.06 GiB is free. Including non-PyTorch memory, this process has 78.04 GiB memory in use.")
_ids = itertools.count()


def cell(strategy: str, ws: int, step_s: float, *, spread: float = 0.01, repeats: bool = True, **kw) -> dict:
    """A cell that ran: interval of +-spread around its median, from repeats unless told."""
    row = dict(cell_id=next(_ids), workload="gpt", strategy=strategy, backend="nccl", device="cuda", world_size=ws,
               status="ok", reason="", role="reference" if strategy == "single" else "", global_batch=GB,
               scaling="strong", precision="bf16", step_time_median_s=step_s,
               step_time_ci_low_s=step_s * (1 - spread), step_time_ci_high_s=step_s * (1 + spread),
               ci_basis="repeats (percentile)" if repeats else "steps (BCa)", stable=True, noise="", contended="",
               throughput_samples_s=GB / step_s)
    row.update(kw)
    return row


def failed(strategy: str, ws: int, reason: str = OOM, **kw) -> dict:
    return dict(cell_id=next(_ids), workload=kw.pop("workload", "gpt"), strategy=strategy, backend="nccl",
                device="cuda", world_size=ws, status="failed", reason=reason,
                role="reference" if strategy == "single" else "", global_batch=GB, scaling="strong",
                precision="bf16", **kw)


def pick(rows: list[dict], backend: str = "nccl", ws: int = 2, workload: str = "gpt", **kw):
    found = [p for p in recommend(pd.DataFrame(rows), **kw)
             if (p.workload, p.backend, p.world_size) == (workload, backend, ws)]
    assert len(found) == 1, found
    return found[0]


def verdict(p, against: Against = Against.RIVAL) -> Verdict:
    return p.pair(against).verdict


def blocked(p) -> list[tuple[BlockerKind, str]]:
    """(kind, cell) of what blocks ``p``: the strategy, or "one device" for the reference."""
    return [(b.kind, "one device" if b.reference else b.strategy) for b in p.blockers]


def left_out(p) -> set[tuple[str, ExcludedKind]]:
    return {(e.strategy, e.kind) for e in p.excluded}


def parts(p) -> list[PartKind]:
    return [r.part for r in p.reasons]


# -- rule 1: one device when every candidate is slower ------------------------------------------------


def test_one_device_when_every_candidate_is_slower():
    p = pick([cell("single", 1, 0.100), cell("ddp", 2, 0.150), cell("fsdp", 2, 0.200)])
    assert p.winner == "ddp" and p.use == "single" and p.kind == DecisionKind.ONE_DEVICE and p.resolved
    assert p.ground == Ground.SLOWER and p.speedup == pytest.approx(0.1 / 0.15)
    assert verdict(p, Against.ONE_DEVICE) == Verdict.B and p.blockers == ()


def test_one_device_also_when_no_candidate_is_faster_beyond_the_noise():
    # ddp's interval lies below one device's: one device is faster beyond the noise
    p = pick([cell("single", 1, 0.100, spread=0.01), cell("ddp", 2, 0.104, spread=0.01)])
    assert p.use == "single" and p.resolved and p.open_cells == () and verdict(p, Against.ONE_DEVICE) == Verdict.B
    # within 3% of one device (both intervals inside the band): the same speed, one device
    same = pick([cell("single", 1, 0.100, spread=0.004), cell("ddp", 2, 0.098, spread=0.004)])
    assert same.speedup > 1 and same.use == "single" and same.resolved
    assert same.ground == Ground.SAME_AS_ONE and verdict(same, Against.ONE_DEVICE) == Verdict.SAME


def test_an_open_pair_names_its_cells_and_the_repeats_that_would_close_it():
    rows = [cell("single", 1, 0.100, spread=0.06, repeats_done=3), cell("ddp", 2, 0.090, spread=0.06, repeats_done=3)]
    p = pick(rows)
    # 10% apart with +-6% intervals: open at 3 repeats; separated once the half-widths fit the gap
    assert p.use == "ddp" and not p.resolved and p.open_cells == (rows[1]["cell_id"], rows[0]["cell_id"])
    assert p.repeats_needed is not None and 3 < p.repeats_needed <= 8
    vs_ref = p.pair(Against.ONE_DEVICE)
    assert (vs_ref.verdict, vs_ref.need, vs_ref.a, vs_ref.b) == (Verdict.OPEN, p.repeats_needed, rows[1]["cell_id"],
                                                                 rows[0]["cell_id"])
    assert p.minutes_needed is None  # the table has no wall times
    # priced from the cells' own repeats: 3 repeats took 90 s of wall time (15 s of it profiled steps)
    priced = [{**r, "cell_wall_s": 90.0, "profile_s": 15.0} for r in rows]
    p = pick(priced)
    assert p.minutes_needed == pytest.approx(2 * (p.repeats_needed - 3) * 25.0 / 60)
    # 2% apart with +-5% intervals: more repeats than it is worth, for a lead under 3%: one device
    # (rule 2: no candidate faster beyond the noise by more than that), decided
    wide = pick([cell("single", 1, 0.100, spread=0.05), cell("ddp", 2, 0.098, spread=0.05)])
    assert wide.use == "single" and wide.kind == DecisionKind.ONE_DEVICE and wide.resolved
    assert wide.ground == Ground.NOT_BEYOND_NOISE and wide.pair(Against.ONE_DEVICE).need is None
    assert "under 3% ahead, which more repeats here would not separate" in words.because_text(wide)
    # 5% apart: a lead that would matter, so it stays open however many repeats it needs
    wider = pick([cell("single", 1, 0.100, spread=0.15), cell("ddp", 2, 0.095, spread=0.15)])
    assert wider.use == "ddp" and not wider.resolved and wider.repeats_needed is None


# -- rule 2: the library default unless another is faster beyond the noise ----------------------------


def test_the_library_default_stays_when_the_leader_is_within_the_noise():
    p = pick([cell("single", 1, 0.200), cell("ddp", 2, 0.100, spread=0.05),
              cell("allreduce-bucketed", 2, 0.097, spread=0.05)])
    assert p.winner == "allreduce-bucketed" and p.use == "ddp" and p.kind == DecisionKind.LIBRARY and not p.resolved
    rival = p.pair(Against.RIVAL)
    assert (p.ground, rival.verdict, rival.b_strategy, rival.need) == (Ground.DEFAULT_STANDS, Verdict.OPEN, "ddp", None)
    assert rival.lead == pytest.approx(0.100 / 0.097 - 1) and rival.repeated
    assert p.reasons  # an open lead says what would explain it
    # the two within 3% of each other: the library default, decided
    same = pick([cell("single", 1, 0.200), cell("ddp", 2, 0.100, spread=0.004),
                 cell("allreduce-bucketed", 2, 0.099, spread=0.004)])
    assert same.use == "ddp" and same.resolved and verdict(same) == Verdict.SAME and same.reasons == ()


def test_the_library_default_stands_decided_where_no_repeats_would_separate_a_small_lead():
    """On 2 noisy cores (cv 20%) allreduce-bucketed led ddp by 1.4% and the pair needed more than
    30 repeats a cell: a lead under 3% that this machine cannot show is no reason to switch, so
    the default stands, decided; over 3%, or from one run, it stays open."""
    rows = [cell("single", 1, 0.200, spread=0.02), cell("ddp", 2, 0.1014, spread=0.15),
            cell("allreduce-bucketed", 2, 0.100, spread=0.15)]
    p = pick(rows)
    rival = p.pair(Against.RIVAL)
    assert p.use == "ddp" and p.ground == Ground.DEFAULT_STANDS and p.resolved
    assert (rival.verdict, rival.need) == (Verdict.OPEN, None)
    assert "it stands: the lead is under 3% and more repeats here would not separate them" in words.because_text(p)
    wider = pick([rows[0], {**rows[1], "step_time_median_s": 0.104, "throughput_samples_s": GB / 0.104}, rows[2]])
    assert wider.use == "ddp" and not wider.resolved
    once = pick([rows[0], {**rows[1], "ci_basis": "steps (BCa)"}, rows[2]])
    assert not once.resolved


def test_the_library_default_leading_an_open_runner_up_is_decided():
    """On 2 cores ddp led ddp-zero1 by 11% within the noise: rule 3 keeps the library default
    unless another is faster beyond the noise, and none is ahead of it, so it is decided; from one
    run it is not."""
    rows = [cell("single", 1, 0.200, spread=0.02), cell("ddp", 2, 0.100, spread=0.10),
            cell("ddp-zero1", 2, 0.111, spread=0.10)]
    p = pick(rows)
    assert p.use == "ddp" and p.ground == Ground.AHEAD and p.resolved and verdict(p) == Verdict.OPEN
    once = pick([rows[0], {**rows[1], "ci_basis": "steps (BCa)"}, rows[2]])
    assert once.use == "ddp" and not once.resolved


def test_a_strategy_faster_beyond_the_noise_wins_with_the_reason():
    rows = [cell("single", 1, 0.150),
            cell("ddp", 2, 0.100, exposed_comm_s=0.030, compute_time_s=0.060, idle_frac=0.1,
                 comm_calls_per_step=160),
            cell("allreduce-bucketed", 2, 0.080, exposed_comm_s=0.010, compute_time_s=0.060, idle_frac=0.1,
                 comm_calls_per_step=4)]
    p = pick(rows)
    assert p.use == "allreduce-bucketed" and p.kind == DecisionKind.FASTER and p.resolved
    assert verdict(p) == Verdict.A and p.pair(Against.RIVAL).b_strategy == "ddp"
    assert parts(p) == [PartKind.EXPOSED_COMM, PartKind.CALLS]  # compute is equal
    assert (p.reasons[0].winner, p.reasons[0].other) == (0.010, 0.030)
    assert (p.reasons[1].winner, p.reasons[1].other) == (4, 160)


def test_fsdp_faster_than_ddp_names_its_bf16_parameters():
    # recorded on 4 H200s (default run, gpt-200m at global batch 64, nccl x2): fsdp-noreshard 12%
    # ahead of DDP with 9% less compute, under the 10% a breakdown part needs to explain a lead
    rows = [cell("single", 1, 0.2332),
            cell("ddp", 2, 0.1226, compute_time_s=0.1202, exposed_comm_s=0.0004, idle_frac=0.023),
            cell("fsdp-noreshard", 2, 0.1096, spread=0.002, compute_time_s=0.1099, exposed_comm_s=0.0019,
                 idle_frac=0.036, fsdp_param_dtype="bf16")]
    p = pick(rows)
    assert p.use == "fsdp-noreshard" and p.kind == DecisionKind.FASTER
    assert parts(p) == [PartKind.PARAM_DTYPE]  # the compute it saves, said once
    assert (p.reasons[0].winner, p.reasons[0].other) == (0.1099, 0.1202)
    # more compute than DDP, or no breakdown: the precision is not offered as the reason
    for kw in ({"compute_time_s": 0.1250}, {"compute_time_s": None}):
        assert PartKind.PARAM_DTYPE not in parts(pick(rows[:2] + [{**rows[2], **kw}]))
    # both under the same policy: no precision reason, and nothing else explains the lead
    rows[1] = {**rows[1], "strategy": "fsdp", "fsdp_param_dtype": "bf16"}
    assert parts(pick(rows)) == [PartKind.NONE_DIFFERS]


def test_fsdp_is_the_default_when_ddp_ran_out_of_memory():
    p = pick([cell("single", 1, 0.200), failed("ddp", 2), cell("fsdp", 2, 0.110, spread=0.05),
              cell("pipeline-1f1b", 2, 0.105, spread=0.05)])
    assert p.use == "fsdp" and p.winner == "pipeline-1f1b" and ("ddp", ExcludedKind.OUT_OF_MEMORY) in left_out(p)


# -- rule 3: a model that does not fit one device ------------------------------------------------------


def test_a_model_that_does_not_fit_one_device_gets_what_fits_with_its_headroom():
    rows = [failed("single", 1), failed("ddp", 2), cell("fsdp", 2, 0.100, peak_mem_bytes=60 * GIB),
            cell("pipeline-1f1b", 2, 0.120, peak_mem_bytes=50 * GIB)]
    p = pick(rows)
    assert p.use == "fsdp" and p.fits_one_device is False and p.speedup is None and p.resolved
    # the device size comes from the out-of-memory message when the caller does not know it
    assert p.headroom == pytest.approx(1 - 60 / 79.11)
    assert (p.fit.peak_bytes, p.fit.device_bytes, p.fit.reference) == (60 * GIB, pytest.approx(79.11 * GIB), "single")
    assert ("ddp", ExcludedKind.OUT_OF_MEMORY) in left_out(p)
    assert pick(rows, gpu_mem=80 * GIB).headroom == pytest.approx(0.25)  # the caller's size wins


def test_cells_skipped_before_they_start_for_memory_count_as_out_of_memory():
    """The planner skips a cell whose parameters alone exceed the device (bench.plan.memory): its
    skipped row reads as running out of memory, and the device size comes from its reason."""
    from bench.core.knobs import Training
    from bench.plan.memory import memory_reason

    class Facts:
        params = 20_000_000_000
        train_bytes = 8 * params  # fp32 values and gradients

    class Cell:
        workload, device, nnodes, n_devices = Facts(), "cuda", 1, 1
        training = Training(optimizer="sgd")

    reason = memory_reason(Cell(), 1.0, 80 * GIB)
    skipped = lambda s, ws: {**failed(s, ws, reason=reason), "status": "skipped"}
    rows = [skipped("single", 1), skipped("ddp", 2), cell("fsdp", 2, 0.100, peak_mem_bytes=60 * GIB),
            cell("pipeline-1f1b", 2, 0.120, peak_mem_bytes=50 * GIB)]
    p = pick(rows)
    assert p.use == "fsdp" and p.fits_one_device is False and p.headroom == pytest.approx(0.25)
    assert p.fit.device_bytes == 80 * GIB


def test_without_fsdp_the_fastest_strategy_that_fits_is_used():
    rows = [failed("single", 1), failed("ddp", 2), cell("tensor", 2, 0.150, peak_mem_bytes=40 * GIB),
            cell("pipeline-1f1b", 2, 0.120, peak_mem_bytes=50 * GIB)]
    p = pick(rows)
    assert p.use == "pipeline-1f1b" and p.fits_one_device is False and p.headroom == pytest.approx(1 - 50 / 79.11)
    assert p.kind == DecisionKind.FASTEST


# -- rule 4: what to try when nothing scales ----------------------------------------------------------


def test_next_step_names_the_faster_backend_and_a_bigger_batch():
    rows = [cell("single", 1, 0.100), cell("ddp", 2, 0.400, backend="gloo", idle_frac=0.5),
            cell("ddp", 2, 0.060, backend="nccl")]
    gloo = pick(rows, backend="gloo")
    assert gloo.use == "single"
    assert [(t.kind, t.name, t.value) for t in gloo.tips] == [(TipKind.BACKEND, "nccl", pytest.approx(1 / 0.6)),
                                                             (TipKind.BIGGER_BATCH, "", 8)]
    assert pick(rows, backend="nccl").tips == ()  # 1.67x on 2 devices scales


def test_next_step_points_to_fewer_devices_and_the_bucket_size():
    rows = [cell("single", 1, 0.100), cell("ddp", 2, 0.060),
            cell("ddp", 4, 0.080, exposed_comm_s=0.040, compute_time_s=0.030, idle_frac=0.1, option_bucket_mb=25.0)]
    p = pick(rows, ws=4)
    assert [(t.kind, t.size, t.name) for t in p.tips] == [(TipKind.FEWER_DEVICES, 2, ""),
                                                         (TipKind.BIGGER_BATCH, None, ""),
                                                         (TipKind.OVERLAP_OPTION, None, "bucket_mb")]
    assert [t.value for t in p.tips] == [pytest.approx(1 / 0.6), 4, 25.0]
    # the overlap option is the strategy's own: a strategy that declares none gets no such tip
    other = pick([rows[0], rows[1], {**rows[2], "strategy": "chain"}], ws=4)
    assert TipKind.OVERLAP_OPTION not in [t.kind for t in other.tips]


# -- rule 5: no decision on unstable, contended or unphysical cells -----------------------------------


def test_no_decision_on_an_unstable_reference():
    ref = cell("single", 1, 0.100, stable=False, noise="cv 12%", repeats=False)
    p = pick([ref, cell("ddp", 2, 0.150)])
    assert p.use is None and p.kind == DecisionKind.UNDECIDED and p.ground == Ground.BLOCKED and not p.resolved
    assert blocked(p) == [(BlockerKind.NOT_STABLE, "one device")] and p.blockers[0].detail == "cv 12%"
    assert p.blockers[0].cell == ref["cell_id"]
    assert p.open_cells == (ref["cell_id"],) and p.repeats_needed == 3  # repeats can lift it
    # measured with repeats, its interval carries the noise: a decision rests on it
    p = pick([cell("single", 1, 0.100, stable=False, noise="cv 12%"), cell("ddp", 2, 0.150)])
    assert p.use == "single" and p.resolved


def test_no_decision_on_a_contended_leader():
    p = pick([cell("single", 1, 0.200), cell("ddp", 2, 0.100, stable=None,
                                                contended="3.5 cores stolen by the hypervisor")])
    assert p.use is None and blocked(p) == [(BlockerKind.CONTENDED, "ddp")]
    assert p.blockers[0].detail == "3.5 cores stolen by the hypervisor" and p.open_cells == ()
    assert p.repeats_needed is None  # repeats do not lift a load on the host


def test_one_device_by_a_margin_no_noise_explains_is_decided_on_a_noisy_machine():
    """On 2 loaded cores every cell is noisy and contended, yet the fastest two-rank cell at 0.39x
    one device is an answer: one device, by at least 2.6x, with the finer ranking left open."""
    busy = dict(stable=False, repeats=False, contended="1.0 cores busy outside the benchmark")
    p = pick([cell("single", 1, 0.010, spread=0.2, noise="cv 23%", **busy),
              cell("chain", 2, 0.026, spread=0.2, noise="cv 25%", **busy),
              cell("ddp", 2, 0.031, spread=0.2, noise="cv 17%", **busy)])
    assert p.use == "single" and p.kind == DecisionKind.ONE_DEVICE and p.ground == Ground.GROSS and p.resolved
    assert p.winner == "chain" and p.speedup == pytest.approx(0.010 / 0.026)
    assert not p.pair(Against.ONE_DEVICE).repeated  # one run a cell
    # the finer ranking is open: the blockers stay on the decision
    assert blocked(p)[0] == (BlockerKind.NOT_STABLE, "one device")
    # a gap the intervals do not keep apart stays undecided
    p = pick([cell("single", 1, 0.010, spread=0.5, noise="cv 40%", **busy),
              cell("ddp", 2, 0.021, spread=0.5, noise="cv 40%", **busy)])
    assert p.use is None and not p.resolved


def test_the_gross_rule_weighs_throughput_and_steps_aside_for_a_load_on_one_side():
    # weak scaling: 4x the samples a step, so 3x the step is faster in samples/s, never "one device"
    p = pick([cell("single", 1, 1.0, repeats=False, scaling="weak"),
              cell("ddp", 4, 3.0, repeats=False, scaling="weak", global_batch=4 * GB)], ws=4)
    assert p.ground != Ground.GROSS and not p.resolved
    # only the candidate contended: the machine may have slowed it, so no gross decision
    p = pick([cell("single", 1, 0.01, repeats=False),
              cell("ddp", 2, 0.05, repeats=False, contended="1.2 cores busy outside the benchmark")])
    assert p.ground == Ground.BLOCKED and blocked(p) == [(BlockerKind.CONTENDED, "ddp")]


def test_an_unstable_runner_up_behind_the_library_default_does_not_block_it():
    p = pick([cell("single", 1, 0.200), cell("ddp", 2, 0.100), cell("fsdp", 2, 0.150, stable=False, noise="cv 9%")])
    assert p.use == "ddp" and p.resolved and p.blockers == ()


def test_no_decision_on_an_efficiency_that_is_not_physical():
    # a loaded CPU machine: chain at 16.31x one device on 2 ranks
    rows = [cell("single", 1, 1.631, device="cpu", precision="fp32"),
            cell("chain", 2, 0.100, device="cpu", precision="fp32")]
    p = pick(rows)
    assert p.use is None and p.speedup == pytest.approx(16.31)
    assert blocked(p) == [(BlockerKind.UNPHYSICAL, "chain")]
    assert p.blockers[0].detail.startswith("efficiency 8.15 > 1.05: not physical")  # the run's scaling note
    # a table without the columns to derive the run's note: the efficiency is checked here
    bare = [{k: v for k, v in r.items() if k != "device"} for r in rows]
    b = pick(bare).blockers[0]
    assert (b.kind, b.detail) == (BlockerKind.UNPHYSICAL, pytest.approx(8.155))
    # the flag decides, not the note's words: a note that says nothing of physics blocks when flagged
    flagged = [{**r, "scaling_note": "see the run's log", "scaling_unphysical": r["strategy"] == "chain"}
               for r in rows]
    assert pick(flagged).blockers[0].detail == "see the run's log"
    assert pick([{**r, "scaling_unphysical": False} for r in flagged]).blockers == ()


# -- rule 6: one run per cell is not a decision -------------------------------------------------------


def test_one_run_per_cell_is_leading_not_decided():
    rows = [cell("single", 1, 0.150, repeats=False),
            cell("ddp", 2, 0.100, repeats=False, exposed_comm_s=0.030, compute_time_s=0.06, comm_calls_per_step=160),
            cell("allreduce-bucketed", 2, 0.080, repeats=False, exposed_comm_s=0.010, compute_time_s=0.06,
                 comm_calls_per_step=4)]
    p = pick(rows)
    assert p.winner == "allreduce-bucketed" and p.use == "ddp" and not p.resolved and p.repeats_needed == 3
    rival = p.pair(Against.RIVAL)
    assert (p.ground, rival.verdict, rival.repeated, rival.need) == (Ground.DEFAULT_STANDS, Verdict.OPEN, False, 3)
    assert parts(p)[0] == PartKind.EXPOSED_COMM
    assert set(p.open_cells) == {r["cell_id"] for r in rows}
    # candidates from repeats, a reference from one run: beating one device is not judged
    unref = pick([cell("single", 1, 0.150, repeats=False), cell("ddp", 2, 0.100), cell("fsdp", 2, 0.130)])
    assert unref.use == "ddp" and not unref.resolved and unref.repeats_needed == 3
    assert verdict(unref, Against.ONE_DEVICE) == Verdict.OPEN
    # a gap no noise explains decides even from one run, and says it was one run
    slower = pick([cell("single", 1, 0.1, repeats=False), cell("ddp", 2, 0.3, repeats=False)])
    assert slower.use == "single" and slower.resolved and slower.ground == Ground.GROSS
    assert not slower.pair(Against.ONE_DEVICE).repeated
    closer = pick([cell("single", 1, 0.1, repeats=False), cell("ddp", 2, 0.15, repeats=False)])
    assert closer.use == "single" and not closer.resolved and closer.repeats_needed == 3
    assert closer.kind == DecisionKind.ONE_DEVICE and closer.ground == Ground.SLOWER


# -- rule 7: launch-bound workloads leave the first screen --------------------------------------------


def test_launch_bound_picks_go_after_the_real_model_decisions():
    rows = [cell("single", 1, 0.002, workload="mlp"), cell("ddp", 2, 0.0015, workload="mlp"),
            cell("single", 1, 0.200), cell("ddp", 2, 0.100), cell("ddp", 4, 0.060, repeats=False),
            cell("single", 1, 0.050, workload="cnn", idle_frac=0.6), cell("ddp", 2, 0.030, workload="cnn")]
    picks = recommend(pd.DataFrame(rows))
    bound = {p.workload: p.launch_bound for p in picks}
    assert bound == {"mlp": True, "gpt": False, "cnn": True}  # mlp: a 2 ms step; cnn: idle 60%
    order = [(p.workload, p.world_size) for p in first_screen(picks)]
    assert order[:2] == [("gpt", 2), ("gpt", 4)]  # resolved first, then the one not judged
    assert {w for w, _ in order[2:]} == {"mlp", "cnn"}


# -- decisions as values -------------------------------------------------------------------------------


def test_decisions_go_to_json_and_back_unchanged():
    rows = [failed("single", 1), failed("ddp", 2), cell("fsdp", 2, 0.100, peak_mem_bytes=60 * GIB),
            cell("pipeline-1f1b", 2, 0.120, peak_mem_bytes=50 * GIB, exposed_comm_s=0.05, compute_time_s=0.05,
                 idle_frac=0.1),
            cell("single", 1, 0.100, workload="mlp", stable=False, noise="cv 12%", repeats=False),
            cell("ddp", 2, 0.150, workload="mlp", option_bucket_mb=25.0, idle_frac=0.4)]
    decisions = recommend(pd.DataFrame(rows)) + recorded_decisions()
    stored = json.loads(json.dumps(decisions_to_json(decisions)))
    assert stored["schema"] == 1 and len(stored["decisions"]) == len(decisions)
    assert decisions_from_json(stored) == decisions
    back = decisions_from_json(stored)[0]
    assert isinstance(back.kind, DecisionKind) and isinstance(back.open_cells, tuple)
    with pytest.raises(ValueError, match="schema 2"):
        decisions_from_json({**stored, "schema": 2})


def recorded_decisions() -> list:
    return [p for name in ("default-matrix-h100-x4.csv", "beyond-one-device-h200-x2.csv", "gate-batch64-h100-x2.csv")
            for p in recommend(recorded(name))]


# -- recorded cells ------------------------------------------------------------------------------------


def recorded(name: str) -> pd.DataFrame:
    return pd.read_csv(FIXTURES / name, dtype={"stable": "boolean", "noise": "string", "contended": "string",
                                               "reason": "string", "fsdp_param_dtype": "string"})


def by_key(cells: pd.DataFrame, **kw) -> dict:
    return {(p.workload, p.backend, p.world_size): p for p in recommend(cells, **kw)}


def test_recorded_default_matrix_decides_nothing_from_one_run():
    cells = recorded("default-matrix-h100-x4.csv")
    picks = by_key(cells)
    # every gloo candidate far slower than one device: decided all the same, from one run; nothing else is
    gloo2, gloo4 = picks[("gpt-200m", "gloo", 2)], picks[("gpt-200m", "gloo", 4)]
    assert len(picks) == 6 and [p for p in picks.values() if p.resolved] == [gloo2, gloo4]
    assert gloo4.use == "single" and gloo4.ground == Ground.GROSS and not gloo4.pair(Against.ONE_DEVICE).repeated
    assert gloo2.winner == "chain" and gloo2.speedup == pytest.approx(0.2685, abs=1e-3)
    assert gloo2.use == "single" and gloo2.ground == Ground.GROSS
    assert blocked(gloo2) == [(BlockerKind.NOT_STABLE, "ddp")] and gloo2.blockers[0].detail == "cv 6%"
    assert gloo2.tips[0].kind == TipKind.BACKEND and gloo2.tips[0].name == "nccl"
    assert gloo2.tips[0].value == pytest.approx(1.58, abs=0.005)
    nccl2 = picks[("gpt-200m", "nccl", 2)]
    assert nccl2.use == "ddp" == nccl2.winner and nccl2.kind == DecisionKind.LIBRARY
    assert not nccl2.resolved and nccl2.repeats_needed == 3 and nccl2.step_ms == pytest.approx(46.3, abs=0.05)
    nccl4 = picks[("gpt-200m", "nccl", 4)]  # the hand-written all-reduce leads ddp by 7% in one noisy run
    assert nccl4.winner == "allreduce-bucketed" and nccl4.use is None
    assert blocked(nccl4) == [(BlockerKind.NOT_STABLE, "allreduce-bucketed")] and nccl4.blockers[0].detail == "cv 6%"
    assert {k[0] for k, p in picks.items() if p.launch_bound} == {"mlp"}
    assert [p.workload for p in first_screen(list(picks.values()))][:4] == ["gpt-200m"] * 4


def test_recorded_default_matrix_if_every_cell_were_stable():
    cells = recorded("default-matrix-h100-x4.csv").assign(stable=True, noise=pd.NA, contended=pd.NA)
    picks = by_key(cells)
    gloo2 = picks[("gpt-200m", "gloo", 2)]
    assert gloo2.use == "single" and gloo2.resolved and gloo2.ground == Ground.GROSS and gloo2.blockers == ()
    nccl4 = picks[("gpt-200m", "nccl", 4)]
    assert nccl4.use == "ddp" and nccl4.winner == "allreduce-bucketed" and not nccl4.resolved
    rival = nccl4.pair(Against.RIVAL)
    assert (rival.verdict, rival.repeated, rival.lead) == (Verdict.OPEN, False, pytest.approx(0.069, abs=5e-4))


def test_recorded_default_matrix_when_the_model_does_not_fit_one_device():
    """The recorded gpt-200m cells with every cell that holds the whole model on one device replaced
    by a CUDA out-of-memory failure: what remains splits or shards the model."""
    cells = recorded("default-matrix-h100-x4.csv").assign(stable=True, noise=pd.NA, contended=pd.NA)
    whole = (cells["workload"] == "gpt-200m") & cells["strategy"].isin(
        ["single", "ddp", "allreduce", "allreduce-bucketed", "dataparallel"])
    cells.loc[whole, "status"] = "failed"
    cells.loc[whole, "reason"] = OOM
    cells.loc[whole, ["step_time_median_s", "throughput_samples_s", "peak_mem_bytes"]] = float("nan")
    picks = by_key(cells)
    p = picks[("gpt-200m", "nccl", 2)]
    fsdp = cells[(cells["workload"] == "gpt-200m") & (cells["strategy"] == "fsdp") & (cells["backend"] == "nccl")
                 & (cells["world_size"] == 2)].iloc[0]
    assert p.use == "fsdp" and p.fits_one_device is False and p.speedup is None
    assert p.headroom == pytest.approx(1 - fsdp["peak_mem_bytes"] / (79.11 * GIB))
    assert p.fit.peak_bytes == fsdp["peak_mem_bytes"] and p.fit.reference == "single"
    assert ("ddp", ExcludedKind.OUT_OF_MEMORY) in left_out(p)
    assert all(p.use == "fsdp" and p.fits_one_device is False for (wl, _, _), p in picks.items() if wl == "gpt-200m")


def test_recorded_repeats_decide_when_nothing_blocks():
    cells = recorded("gate-batch64-h100-x2.csv")
    (p,) = recommend(cells)
    # as recorded: fsdp is bimodal, but its interval comes from repeats and lies clear of ddp's
    assert p.use == "fsdp" and p.resolved and p.noise == "bimodal"
    (one_run,) = recommend(cells.assign(ci_basis="steps (BCa)"))
    assert blocked(one_run) == [(BlockerKind.NOT_STABLE, "fsdp")] and one_run.blockers[0].detail == "bimodal"
    steady = cells.assign(stable=True, noise=pd.NA)
    (p,) = recommend(steady)
    assert p.use == "fsdp" and p.kind == DecisionKind.FASTER and p.resolved
    assert p.speedup == pytest.approx(2.189, abs=1e-3)
    rival = p.pair(Against.RIVAL)
    assert rival.b_strategy == "ddp" and rival.lead == pytest.approx(0.18, abs=5e-3)
    assert p.step_ms == pytest.approx(125.7, abs=0.05) and p.workload == "gpt-200m(global_batch=64)"
    # its efficiency of 1.09 is explained by bf16 parameters; without that the run calls it not physical
    (p,) = recommend(steady.assign(fsdp_param_dtype=pd.NA))
    assert p.use is None and blocked(p) == [(BlockerKind.UNPHYSICAL, "fsdp")]
    assert p.blockers[0].detail.startswith("efficiency 1.09 > 1.05")


def test_recorded_model_beyond_one_device_gets_what_fits_with_its_headroom():
    """gpt-20b on 2 H200s (2 repeats a cell): the reference and DDP skipped before they started (their
    parameters alone exceed a GPU); FSDP, tensor parallel and 1F1B ran. No parity can be checked
    without a device that holds the model: the cells that fit are still the candidates, with the
    run's parity column present and empty as a run writes it, and the answer says parity was not
    checked."""
    cells = recorded("beyond-one-device-h200-x2.csv").assign(parity_ok=pd.Series(pd.NA, dtype="boolean"))
    p = by_key(cells)[("gpt-20b(global_batch=8,n_layer=44)", "nccl", 2)]
    assert p.use == "fsdp" and p.winner == "tensor" and p.candidates == 3 and p.fits_one_device is False
    assert p.headroom == pytest.approx(1 - 8.6085e10 / (140.4 * GIB), abs=1e-3)
    assert p.fit.parity_checked is False and p.ground == Ground.DEFAULT_STANDS
    assert p.pair(Against.RIVAL).lead == pytest.approx(0.005, abs=5e-4)
    assert not p.resolved and p.repeats_needed == 3  # 2 repeats a cell decide nothing yet
    # A workload whose reference ran and was not compared has no candidate: no answer, and why.
    ran = cells.copy()
    ran.loc[ran["strategy"] == "single", ["status", "reason", "step_time_median_s"]] = ["ok", "", 2.0]
    (p,) = by_key(ran).values()
    assert p.use is None and p.ground == Ground.NONE_PASSED and p.nearest_parity is None
    assert words.because_text(p) == ("no strategy matched one device (fsdp, tensor, pipeline-1f1b not checked "
                                     "(no single-device reference))")


def test_recorded_default_run_on_two_gpus_decides_every_workload():
    """The default GPU matrix on 2 H200s (gpt-200m at global batch 64, and gpt-20b's shape at 43
    layers, which no single GPU holds): every decision resolved within the run's 10-minute budget,
    none of them a strategy slower than one device, and the model beyond one device answered by the
    library strategy that fits, the faster tensor-parallel cell being within 3% of it."""
    picks = by_key(recorded("default-run-h200-x2.csv"))
    assert all(p.resolved for p in picks.values())
    gloo = picks[("gpt-200m(global_batch=64)", "gloo", 2)]
    assert gloo.use == "single" and gloo.speedup < 1
    nccl = picks[("gpt-200m(global_batch=64)", "nccl", 2)]
    assert (nccl.use, nccl.kind) == ("fsdp-noreshard", DecisionKind.FASTER) and PartKind.PARAM_DTYPE in parts(nccl)
    big = picks[("gpt-20b(n_layer=43)", "nccl", 2)]
    assert (big.use, big.winner, big.fits_one_device) == ("fsdp", "tensor", False)
    assert big.significant and big.same_speed and big.headroom == pytest.approx(0.441, abs=1e-3)
    assert big.margin == pytest.approx(0.010, abs=5e-4) and big.runner_up == "fsdp"


@pytest.mark.parametrize("run_id", ["20261128-155644-addb", "20261128-161615-d5a1"])
def test_recorded_default_runs_on_four_gpus_decide_alike(run_id):
    """Two default runs on 4 H200s, one after the other: every decision resolved, none a strategy
    slower than one device, and both runs give the same answers. Their gpt-20b cells have tensor
    parallel 2.7% and 2.8% ahead of FSDP, both beyond the noise, with intervals of different
    widths (the later run's reach past the 3% band): the same speed in both, and the library
    default stands."""
    cells = recorded("default-run-h200-x4.csv")
    picks = by_key(cells[cells["run_id"] == run_id])
    assert len(picks) == 5 and all(p.resolved for p in picks.values())
    # nothing slower than one device (a model one device cannot hold has no single-device speed)
    assert all(p.use == "single" or p.fits_one_device is False or p.speedup > 1 for p in picks.values())
    for ws in (2, 4):
        gloo = picks[("gpt-200m(global_batch=64)", "gloo", ws)]
        assert gloo.use == "single" and gloo.speedup < 1 and (TipKind.BACKEND, "nccl") == (gloo.tips[0].kind,
                                                                                           gloo.tips[0].name)
    assert picks[("gpt-200m(global_batch=64)", "nccl", 2)].use == "fsdp-noreshard"
    main = picks[("gpt-200m(global_batch=64)", "nccl", 4)]
    assert (main.use, main.kind, main.runner_up) == ("ddp", DecisionKind.LIBRARY, "allreduce-bucketed")
    assert main.significant and main.same_speed
    big = picks[("gpt-20b(n_layer=43)", "nccl", 4)]
    assert (big.use, big.winner, big.fits_one_device) == ("fsdp", "tensor", False)
    assert big.significant and big.same_speed and big.headroom == pytest.approx(0.70, abs=0.01)
    assert verdict(big) == Verdict.SAME


@pytest.mark.parametrize("gap, kind, value", [
    (-0.05, BoundKind.COMMUNICATION, 0.70), (-0.101, BoundKind.OFF, -0.101), (0.39, BoundKind.OFF, 0.39)])
def test_a_breakdown_far_from_the_timed_step_says_nothing_of_its_bound(gap, kind, value):
    """The fastest line's bound comes from the breakdown only where the profiled step is within 10%
    of the timed one (the later 4-GPU default run's Gloo DDP at 2 GPUs was -10.1% off)."""
    from bench.decide.rules import bounds

    r = pd.Series(cell("ddp", 2, 0.5, exposed_comm_s=0.35 * (1 + gap), compute_time_s=0.14, idle_frac=0.003,
                       profiled_step_s=0.5 * (1 + gap), breakdown_gap=gap, mfu=0.1))
    (b,) = bounds(r)
    assert (b.kind, b.value, b.moved) == (kind, pytest.approx(value), None)


@pytest.mark.parametrize("unprofiled, moved", [(0.52, None), (0.59, 0.18)])
def test_an_off_breakdown_says_when_the_rebuilt_cell_was_off_before_profiling(unprofiled, moved):
    """FSDP at 4 GPUs in a default run: timed at 75 ms in its repeat's build, 88 ms unprofiled in the
    profile pass's build: the profiler is not what moved that step, and the bound says so."""
    from bench.decide.rules import bounds, rebuild_off

    r = pd.Series(cell("fsdp", 4, 0.5, exposed_comm_s=0.1, compute_time_s=0.5, idle_frac=0.01, profiled_step_s=0.65,
                       breakdown_gap=0.3, unprofiled_step_s=unprofiled, profile_builds=2, mfu=0.3))
    (b,) = bounds(r)
    assert (b.kind, b.value) == (BoundKind.OFF, pytest.approx(0.3))
    assert b.moved == (None if moved is None else pytest.approx(moved))
    inline = r.drop("profile_builds")  # profiled in the timed repeat's own build: never "built again"
    assert rebuild_off(inline) is None and bounds(inline)[0].moved is None
    assert (rebuild_off(r) is None) == (unprofiled == 0.52)


def test_a_lead_beyond_the_noise_is_sized_at_the_medians():
    """Separated intervals make a lead real; its size is the medians' ratio. 2.8% apart with narrow
    intervals and with wider ones (still separated) both read the same speed; 3.5% apart is a switch."""
    for spread in (0.002, 0.006):
        p = pick([cell("single", 1, 0.400), cell("ddp", 2, 0.2056, spread=spread),
                  cell("allreduce-bucketed", 2, 0.200, spread=spread)])
        assert p.significant and p.same_speed and p.use == "ddp", spread
    p = pick([cell("single", 1, 0.400), cell("ddp", 2, 0.207, spread=0.006),
              cell("allreduce-bucketed", 2, 0.200, spread=0.006)])
    assert p.significant and not p.same_speed and (p.use, p.kind) == ("allreduce-bucketed", DecisionKind.FASTER)


def test_each_way_of_training_gets_its_own_pick_against_its_own_reference():
    """--compile off,on: the compiled cells compete among themselves and are read against the
    compiled one-device cell, never against the eager ones; the pick's title names the knob."""
    eager = dict(optimizer="adamw", compile="off", ac="none")
    comp = dict(optimizer="adamw", compile="on", ac="none")
    rows = [cell("single", 1, 0.200, **eager), cell("ddp", 2, 0.110, **eager), cell("fsdp", 2, 0.130, **eager),
            cell("single", 1, 0.100, **comp), cell("ddp", 2, 0.060, **comp), cell("fsdp", 2, 0.070, **comp)]
    picks = {p.training["compile"]: p for p in recommend(pd.DataFrame(rows))}
    assert set(picks) == {"off", "on"}  # the knob the run varies, named in both
    on, off = picks["on"], picks["off"]
    assert on.training == {"compile": "on"} and on.knobs == comp
    assert (on.winner, on.runner_up, off.winner, off.runner_up) == ("ddp", "fsdp", "ddp", "fsdp")
    assert on.speedup == pytest.approx(0.100 / 0.060) and off.speedup == pytest.approx(0.200 / 0.110)
    assert on.title == "gpt, nccl x2, compile=on" and off.title == "gpt, nccl x2, compile=off"
    assert recommend(pd.DataFrame(rows[:3]))[0].training == {}  # one way of training: nothing to name


def test_the_reference_is_found_by_its_declared_role_where_rows_carry_none():
    rows = [cell("single", 1, 0.100), cell("ddp", 2, 0.150), cell("fsdp", 2, 0.200)]
    bare = pd.DataFrame(rows).drop(columns="role")
    (p,) = recommend(bare)
    assert p.kind == DecisionKind.ONE_DEVICE and p.speedup == pytest.approx(0.1 / 0.15)
    # a cell in the reference role is the reference whatever its strategy is called
    renamed = [{**rows[0], "strategy": "one-gpu"}] + rows[1:]
    (p,) = recommend(pd.DataFrame(renamed))
    assert p.use == "one-gpu" and p.kind == DecisionKind.ONE_DEVICE


def test_a_group_whose_every_cell_failed_parity_gets_no_answer_and_the_nearest_failure():
    """A BatchNorm model under data parallelism: every cell ran and none matched one device. The group
    is not dropped: it answers "no decision", names what failed and the failure nearest to passing
    (its difference, step, tolerance and BatchNorm's fix); a group with a passing cell is unchanged."""
    bn = dict(workload="bn", batch_norm="BatchNorm2d", parity_tol=3.3e-5, parity_ok=False)
    rows = [cell("single", 1, 1.0, workload="bn", parity_ok=pd.NA),
            cell("ddp", 2, 0.6, parity_rel_err=4e-3, parity_step=5, **bn),
            cell("fsdp", 2, 0.7, parity_rel_err=1e-3, parity_step=15, **bn),
            cell("single", 1, 1.0, parity_ok=pd.NA), cell("ddp", 2, 0.6, parity_rel_err=1e-7, parity_ok=True),
            cell("fsdp", 2, 0.7, parity_rel_err=3e-3, parity_step=2, parity_tol=1e-5, parity_ok=False)]
    p = pick(rows, workload="bn")
    assert p.use is None and p.ground == Ground.NONE_PASSED and p.resolved and p.candidates == 0
    assert left_out(p) == {("ddp", ExcludedKind.PARITY_FAILED), ("fsdp", ExcludedKind.PARITY_FAILED)}
    line = words.lines(p)
    assert len(line) == 1 and line[0].startswith(
        "bn, nccl x2: no decision: no strategy matched one device (ddp, fsdp failed parity); the nearest, fsdp: "
        "parity with one device failed: rel err 1.0e-03 at step 15 > tolerance 3.3e-05")
    assert "BatchNorm2d" in line[0] and "SyncBatchNorm" in line[0]
    assert pick(rows).use is not None and pick(rows).ground != Ground.NONE_PASSED
