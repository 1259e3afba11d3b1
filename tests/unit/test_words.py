"""The recommendation's sentences (reports.words): a few golden lines per kind of decision, on the
hand-built cells and the recorded ones of test_recommend.py, and the printed screen read back."""

from __future__ import annotations

import pandas as pd
import pytest

from bench.decide.decision import Against, Decision, DecisionKind, Ground, Pair, Verdict
from bench.decide.recommend import recommend
from reports import words
from tests.unit.test_recommend import GIB, by_key, cell, failed, pick, recorded


def first(rows, **kw) -> str:
    return words.lines(pick(rows, **kw))[0]


def test_one_device():
    assert words.lines(pick([cell("single", 1, 0.100), cell("ddp", 2, 0.150), cell("fsdp", 2, 0.200)])) == [
        "gpt, nccl x2: use one device: every candidate is slower than one device: the best, ddp, reaches 0.67x",
        "fastest: ddp 150.0 ms/step, 0.67x one device; +33% ahead of fsdp (beyond the noise); bound not known "
        "(no breakdown)"]
    assert first([cell("single", 1, 0.100, spread=0.004), cell("ddp", 2, 0.098, spread=0.004)]) == (
        "gpt, nccl x2: use one device: no candidate is faster than one device: the best, ddp, reaches 1.02x, "
        "within 3%")
    p = Decision(workload="gpt", backend="nccl", world_size=2, winner="ddp", step_ms=1.0, speedup=1.01,
                 kind=DecisionKind.ONE_DEVICE, ground=Ground.NOT_BEYOND_NOISE, use="single", resolved=True)
    assert words.because_text(p) == ("no candidate is faster than one device beyond the noise: the best, ddp, "
                                     "reaches 1.01x")


def test_one_device_by_a_gap_no_noise_explains():
    busy = dict(stable=False, repeats=False, contended="1.0 cores busy outside the benchmark")
    assert first([cell("single", 1, 0.010, spread=0.2, noise="cv 23%", **busy),
                  cell("chain", 2, 0.026, spread=0.2, noise="cv 25%", **busy),
                  cell("ddp", 2, 0.031, spread=0.2, noise="cv 17%", **busy)]) == (
        "gpt, nccl x2: use one device: every candidate is slower than one device, by at least 2.6x: the best, "
        "chain, reaches 0.38x (one run a cell), a gap no noise of this run explains (the finer ranking is open: "
        "not stable: one device (cv 23%), chain (cv 25%), ddp (cv 17%))")
    assert first([cell("single", 1, 0.1, repeats=False), cell("ddp", 2, 0.15, repeats=False)]).startswith(
        "gpt, nccl x2: one device leads, not decided (needs about 3 repeats a cell): every candidate is slower")


def test_library_default_and_faster():
    assert first([cell("single", 1, 0.200), cell("ddp", 2, 0.100, spread=0.05),
                  cell("allreduce-bucketed", 2, 0.097, spread=0.05)]) == (
        "gpt, nccl x2: ddp leads, not decided (more repeats would not separate them): allreduce-bucketed leads it "
        "by +3.1% within the noise (no breakdown says why (profiling off)); it stands until repeats say otherwise")
    assert first([cell("single", 1, 0.200), cell("ddp", 2, 0.100, spread=0.004),
                  cell("allreduce-bucketed", 2, 0.099, spread=0.004)]) == (
        "gpt, nccl x2: use ddp: allreduce-bucketed leads it by +1.0% within 3%, the same speed")
    assert first([cell("single", 1, 0.150),
                  cell("ddp", 2, 0.100, exposed_comm_s=0.030, compute_time_s=0.060, idle_frac=0.1,
                       comm_calls_per_step=160),
                  cell("allreduce-bucketed", 2, 0.080, exposed_comm_s=0.010, compute_time_s=0.060, idle_frac=0.1,
                       comm_calls_per_step=4)]) == (
        "gpt, nccl x2: use allreduce-bucketed: +25% faster than ddp (library default) beyond the noise: less "
        "exposed communication (10.0 vs 30.0 ms a step), fewer calls (4 vs 160 a step)")
    rows = [cell("single", 1, 0.2332), cell("ddp", 2, 0.1226, compute_time_s=0.1202, exposed_comm_s=0.0004,
                                            idle_frac=0.023),
            cell("fsdp-noreshard", 2, 0.1096, spread=0.002, compute_time_s=0.1099, exposed_comm_s=0.0019,
                 idle_frac=0.036, fsdp_param_dtype="bf16")]
    assert words.because_text(pick(rows)) == (
        "+12% faster than ddp (library default) beyond the noise: its parameters are bf16 (FSDP's "
        "MixedPrecisionPolicy) where ddp casts fp32 ones under autocast (compute 109.9 vs 120.2 ms a step)")


def test_a_model_beyond_one_device():
    p = pick([failed("single", 1), failed("ddp", 2), cell("fsdp", 2, 0.100, peak_mem_bytes=60 * GIB),
              cell("pipeline-1f1b", 2, 0.120, peak_mem_bytes=50 * GIB)])
    assert words.because_text(p) == (
        "does not fit one device (single: out of memory); peak 60.0 of 79.1 GiB, 24% headroom; parity not checked "
        "(no device ran the whole model); the library default, +20% ahead of pipeline-1f1b beyond the noise")
    assert words.excluded_text(p) == "ddp: out of memory"
    big = by_key(recorded("default-run-h200-x2.csv"))[("gpt-20b(n_layer=43)", "nccl", 2)]
    assert words.measured_text(big) == ("fastest: tensor 1036.0 ms/step; +1.0% ahead of fsdp (beyond the noise, "
                                        "within 3%: the same speed)")


def test_no_decision():
    assert first([cell("single", 1, 0.100, stable=False, noise="cv 12%", repeats=False), cell("ddp", 2, 0.150)]) == \
        "gpt, nccl x2: no decision: not stable: one device (cv 12%)"
    assert first([cell("single", 1, 0.200), cell("ddp", 2, 0.100, stable=None,
                                                   contended="3.5 cores stolen by the hypervisor")]) == \
        "gpt, nccl x2: no decision: contended: ddp (3.5 cores stolen by the hypervisor)"
    rows = [cell("single", 1, 1.631, device="cpu", precision="fp32"),
            cell("chain", 2, 0.100, device="cpu", precision="fp32")]
    assert words.because_text(pick(rows)) == (
        "efficiency not physical: chain (efficiency 8.15 > 1.05: not physical, noise or a slow reference)")
    bare = [{k: v for k, v in r.items() if k != "device"} for r in rows]
    assert words.because_text(pick(bare)) == "efficiency not physical: chain (efficiency 8.15 > 1.05)"


def test_open_decisions_say_what_would_close_them():
    rows = [cell("single", 1, 0.100, spread=0.06, repeats_done=3), cell("ddp", 2, 0.090, spread=0.06, repeats_done=3)]
    p = pick(rows)
    assert words.decided_text(p) == f"leading, not decided (needs about {p.repeats_needed} repeats a cell)"
    priced = pick([{**r, "cell_wall_s": 90.0, "profile_s": 15.0} for r in rows])
    assert words.open_text(priced) == f"needs about {p.repeats_needed} repeats a cell, under a minute"
    slow = pick([{**r, "cell_wall_s": 900.0, "profile_s": 15.0} for r in rows])
    assert words.open_text(slow) == f"needs about {p.repeats_needed} repeats a cell, ~{slow.minutes_needed:.0f} min"


def test_recorded_lines():
    picks = by_key(recorded("default-matrix-h100-x4.csv"))
    assert words.lines(picks[("gpt-200m", "nccl", 2)])[0] == (
        "gpt-200m, nccl x2: ddp leads, not decided (needs about 3 repeats a cell): the library default, +15% "
        "ahead of allreduce-bucketed in one run")
    assert words.lines(picks[("gpt-200m", "nccl", 4)]) == [
        "gpt-200m, nccl x4: no decision: not stable: allreduce-bucketed (cv 6%)",
        "fastest: allreduce-bucketed 58.1 ms/step, 1.26x one device; +6.9% ahead of ddp (one run: not judged); "
        "bound not known (its profiled step is +169% off the timed one); noisy: cv 6%",
        "next: try fewer devices (x2 reaches 1.58x); a bigger batch per device (4 samples now); another --option "
        "bucket_mb (now 25 MiB) for more overlap"]
    (p,) = recommend(recorded("gate-batch64-h100-x2.csv").assign(stable=True, noise=pd.NA))
    assert words.lines(p)[0] == ("gpt-200m(global_batch=64), nccl x2: use fsdp: +18% faster than ddp (library "
                                 "default) beyond the noise: no breakdown says why (profiling off)")


def test_what_bounds_the_step_and_what_to_try():
    r = pd.Series(cell("fsdp", 4, 0.5, exposed_comm_s=0.1, compute_time_s=0.5, idle_frac=0.01, profiled_step_s=0.65,
                       breakdown_gap=0.3, unprofiled_step_s=0.59, profile_builds=2, mfu=0.3))
    assert words.why(r) == ("bound not known (its profiled step is +30% off the timed one; built again for profiling "
                            "it ran +18.0% off unprofiled: its step moves from build to build)")
    rows = [cell("single", 1, 0.100), cell("ddp", 2, 0.400, backend="gloo", idle_frac=0.5),
            cell("ddp", 2, 0.060, backend="nccl")]
    assert words.next_text(pick(rows, backend="gloo")) == (
        "try the nccl backend (1.67x at x2); a bigger batch per device (8 samples now)")


@pytest.mark.parametrize("apart, verdict, text", [
    (None, Verdict.OPEN, "one run: not judged"), (None, Verdict.SAME, "one run: not judged"),
    (False, Verdict.SAME, "within the noise"), (True, Verdict.A, "beyond the noise"),
    (True, Verdict.SAME, "beyond the noise, within 3%: the same speed")])
def test_the_lead_is_read_against_the_noise_and_the_equivalence_band(apart, verdict, text):
    pair = Pair(against=Against.RUNNER_UP, a=0, b=1, a_strategy="a", b_strategy="b", verdict=verdict, lead=0.01,
                apart=apart)
    p = Decision(workload="w", backend="nccl", world_size=2, winner="a", step_ms=1.0, runner_up="b", pairs=(pair,),
                 kind=DecisionKind.LIBRARY, ground=Ground.AHEAD)
    assert words.noise_text(p) == text


def test_titles_name_the_knobs_the_run_varies():
    comp = dict(optimizer="adamw", compile="on", ac="none")
    rows = [cell("single", 1, 0.100, **comp), cell("ddp", 2, 0.060, **comp),
            cell("single", 1, 0.200, **{**comp, "compile": "off"}), cell("ddp", 2, 0.110, **{**comp, "compile": "off"})]
    heads = sorted(words.lines(p)[0].split(": ")[0] for p in recommend(pd.DataFrame(rows)))
    assert heads == ["gpt, nccl x2, compile=off", "gpt, nccl x2, compile=on"]
    assert words.training_text(recommend(pd.DataFrame(rows[:2]))[0]) == ""


def test_the_printed_screen_is_read_back_by_its_titles():
    screen = "\n".join([
        "recommendation:",
        "  mlp, nccl x4: use ddp: launch-bound",
        "gpt, gloo x4: use one device: every candidate is slower than one device: the",
        "best, ddp, reaches 0.32x",
        "fastest: ddp 736.8 ms/step, 0.32x one device",
        "\tgpt, nccl x4: use ddp: the library default, +3% ahead of allreduce-bucketed",
        "   beyond the noise",
        "    next: try fewer devices"])
    assert words.said(screen, "gpt", "nccl", 4) == ("use ddp: the library default, +3% ahead of allreduce-bucketed "
                                                    "beyond the noise")
    assert words.said(screen, "gpt", "gloo", 4).endswith("the best, ddp, reaches 0.32x")
    assert words.said(screen, "gpt", "nccl", 2) == ""
    assert words.said(screen, "mlp", "nccl", 4) == "use ddp: launch-bound"


def test_no_decision_says_what_became_of_the_cells_on_more_than_one_device():
    """A budget spent on one device's repeats skipped every DDP cell: the last line says so, not that
    no strategy passed."""
    from reports.words import nothing_beyond_one, screen

    ran = pd.DataFrame({"world_size": [1, 2, 2], "status": ["ok", "skipped", "skipped"],
                        "reason": ["", "deadline passed before this cell's group", ""]})
    said = nothing_beyond_one(ran)
    assert said == "no cell on more than one device ran: 2 skipped (deadline passed before this cell's group)"
    assert screen([], [], said) == [(f"recommendation: {said}", "")]
    assert nothing_beyond_one(ran.iloc[:1]) == "no cell on more than one device was planned"
    assert nothing_beyond_one(ran.assign(status="ok")) == "no strategy on more than one device passed"
