"""The regression verdict: rank test + Hodges-Lehmann shift, errors for empty comparisons.
The gate's calibration on recorded step times is tested with its tool, in tests/tools/test_calibrate.py."""


import re

import numpy as np
import pandas as pd
import pytest

from bench.core.errors import UserError
from bench.gate.compare import decide, failed, parse_threshold
from bench.gate.samples import Samples, step_times
from bench.results.migrate import upgrade
from bench.stats.ranktests import ALPHA, min_samples, shift_test
from tests.regress_helpers import frames_compare, make_run


def cmp(base, cur, thr=0.05, **kw):
    return frames_compare(base[0], cur[0], thr, base_steps=base[1], cur_steps=cur[1], **kw).set_index("strategy")


def test_verdicts():
    base = make_run({"ddp": 1.0, "allreduce": 1.0, "single": 1.0, "gone": 1.0, "fsdp": 1.0, "wobbly": 1.0})
    cur = make_run({"ddp": 1.10, "allreduce": 1.01, "single": 0.8, "fsdp": 1.0, "new": 1.0, "wobbly": 1.0},
                   statuses={"fsdp": "failed"}, seed=1)
    wobble = np.repeat(np.exp(np.random.default_rng(2).normal(0, 0.3, 30)), 2)  # same factor on both ranks
    cur[1].loc[cur[1]["cell_id"] == 5, "step_time_s"] *= wobble
    t = cmp(base, cur)
    assert t.loc["ddp", "verdict"] == "regression" and t.loc["ddp", "shift"] == pytest.approx(0.10, abs=0.01)
    assert t.loc["ddp", "shift_low"] < 0.10 < t.loc["ddp", "shift_high"]
    assert t.loc["allreduce", "verdict"] == "same"
    assert t.loc["single", "verdict"] == "improvement"
    assert t.loc["gone", "verdict"] == "missing" and t.loc["new", "verdict"] == "new"
    assert t.loc["fsdp", "verdict"] == "broken"
    assert t.loc["wobbly", "verdict"] == "noisy" and t.loc["wobbly", "needed"] > 30
    assert "would resolve" in t.loc["wobbly", "note"]
    assert failed(t.reset_index())


def test_require_repeats():
    """One run's steps a side cannot fail with require_repeats; repeats still can."""
    t = cmp(make_run({"ddp": 1.0}), make_run({"ddp": 1.3}, seed=1), require_repeats=True)
    assert t.loc["ddp", "verdict"] == "noisy" and "--single-run" in t.loc["ddp", "note"]
    t = cmp(make_run({"ddp": 1.0}, repeats=6, n=5), make_run({"ddp": 1.3}, repeats=6, n=5, seed=1),
            require_repeats=True)
    assert t.loc["ddp", "verdict"] == "regression"


def test_small_significant_change_is_not_a_regression():
    """+2% is real (tight samples) but below the 5% threshold: it passes."""
    t = cmp(make_run({"ddp": 1.0}, noise=0.002), make_run({"ddp": 1.02}, noise=0.002, seed=3))
    assert t.loc["ddp", "p_value"] < ALPHA and t.loc["ddp", "verdict"] == "same"


def test_overlapping_noise_is_not_a_regression():
    """The issue's case: a +20% median difference drawn from one wide distribution is noise."""
    rng = np.random.default_rng(7)
    base, cur = make_run({"ddp": 1.0}, n=10), make_run({"ddp": 1.0}, n=10, seed=8)
    cur[1]["step_time_s"] *= np.exp(rng.normal(0.2, 0.5, len(cur[1])))
    assert cmp(base, cur).loc["ddp", "verdict"] in ("noisy", "same")


def test_repeats_are_the_samples():
    """With >= 3 repeats a side the per-repeat medians are tested (n = repeats, not steps)."""
    t = cmp(make_run({"ddp": 1.0}, repeats=8, n=10), make_run({"ddp": 1.2}, repeats=8, n=10, seed=5))
    assert t.loc["ddp", "unit"] == "repeats" and t.loc["ddp", "n_cur"] == 8
    assert t.loc["ddp", "verdict"] == "regression"
    few = cmp(make_run({"ddp": 1.0}, repeats=3), make_run({"ddp": 1.0}, repeats=3, seed=5))
    assert few.loc["ddp", "verdict"] == "noisy" and few.loc["ddp", "needed"] >= min_samples()


def test_against_run_to_run_noise():
    """A history's per-run medians: a change inside their spread is noise, far outside it is not."""
    rng = np.random.default_rng(4)
    runs = np.exp(rng.normal(0, 0.10, 12))  # 10% between runs, as on a shared CPU
    base = (make_run({"ddp": 1.0})[0], {0: Samples(runs, "runs")})
    for t, verdict in ((1.08, "noisy"), (2.0, "regression")):
        cells, steps = make_run({"ddp": t}, seed=9)
        r = frames_compare(base[0], cells, 0.05, base_samples=base[1], cur_steps=steps).iloc[0]
        assert r["verdict"] == verdict and r["unit"] == "runs"
    quiet = {0: Samples(np.exp(rng.normal(0, 0.002, 12)), "runs")}
    cells, steps = make_run({"ddp": 1.06}, seed=9)
    assert frames_compare(base[0], cells, 0.05, base_samples=quiet, cur_steps=steps).iloc[0]["verdict"] == "regression"


def test_step_time_is_the_slowest_rank():
    _, steps = make_run({"a": 1.0}, noise=0)
    assert step_times(steps)["step_time_s"].tolist() == pytest.approx([1.0] * 30)


@pytest.mark.parametrize("col, a, b", [("precision", "fp32", "bf16"), ("gpu_name", "H100", "H200"),
                                       ("params", 100, 200), ("flops_per_sample", 1e9, 2e9)])
def test_incomparable_cells(col, a, b):
    base, cur = make_run({"ddp": 1.0, "x": 1.0}), make_run({"ddp": 1.0, "x": 1.0})
    base[0][col] = base[0][col].astype(object) if col in base[0] else None
    cur[0][col] = cur[0][col].astype(object) if col in cur[0] else None
    base[0].loc[0, col], cur[0].loc[0, col] = a, b
    t = cmp(base, cur)
    assert t.loc["ddp", "verdict"] == "incomparable" and str(b) in t.loc["ddp", "note"]
    assert t.loc["ddp", "note"].startswith(f"{col} {a} vs {b}: measure both sides ")  # the difference, the fix
    assert t.loc["x", "verdict"] == "same"


@pytest.mark.parametrize("field, a, b, line", [
    ("torch", "2.11.0", "2.13.0", "torch 2.11.0 vs 2.13.0: measure both sides with one torch"),
    ("nccl", "2.27", "2.28", "nccl 2.27 vs 2.28: measure both sides with one NCCL"),
    ("gpus", ["NVIDIA H100"], ["NVIDIA H200"], "GPUs NVIDIA H100 vs NVIDIA H200: measure both sides on one GPU model")])
def test_run_level_incomparable_is_an_error(field, a, b, line):
    base, cur = make_run({"ddp": 1.0}), make_run({"ddp": 1.0})
    with pytest.raises(UserError) as e:
        cmp(base, cur, base_meta={field: a}, cur_meta={field: b})
    assert str(e.value) == f"incomparable: {line}"


def test_every_difference_of_an_incomparable_pair_in_one_line():
    base, cur = make_run({"ddp": 1.0, "x": 1.0}), make_run({"ddp": 1.0, "x": 1.0})
    cur[0]["precision"] = "bf16"
    with pytest.raises(UserError) as e:
        cmp(base, cur, base_meta={"torch": "2.11.0", "gpus": ["A"]}, cur_meta={"torch": "2.13.0", "gpus": ["B"]})
    assert str(e.value) == ("incomparable: torch 2.11.0 vs 2.13.0; precision fp32 vs bf16; GPUs A vs B: measure both "
                            "sides with one torch, with one --precision and on one GPU model")


def test_nothing_compared_is_an_error():
    base, cur = make_run({"ddp": 1.0}), make_run({"fsdp": 1.0})
    with pytest.raises(UserError, match="share no cell"):
        cmp(base, cur)
    cur = make_run({"ddp": 1.0})
    cur[0]["world_size"] = cur[0]["world_size"].astype(str)
    with pytest.raises(UserError, match="'world_size'"):
        cmp(base, cur)
    with pytest.raises(UserError, match="throughput"):
        cmp(base, (cur[0].drop(columns=["throughput_samples_s", "world_size"]).assign(world_size=2), cur[1]))
    skipped = make_run({"ddp": 1.0}, statuses={"ddp": "skipped"})
    with pytest.raises(UserError, match="ran in both"):
        cmp(skipped, skipped)


def test_key_dtypes_that_agree_in_value_join():
    """micro_batches 8 (Int64) and 8.0 (float) are the same cell."""
    base, cur = make_run({"pp": 1.0}), make_run({"pp": 1.0})
    base[0]["micro_batches"], cur[0]["micro_batches"] = pd.array([8], "Int64"), [8.0]
    assert cmp(base, cur).loc["pp", "verdict"] == "same"


def test_no_steps_falls_back_to_intervals():
    base, cur = make_run({"ddp": 1.0}), make_run({"ddp": 1.5})
    t = frames_compare(base[0], cur[0], 0.05).set_index("strategy")
    assert t.loc["ddp", "verdict"] == "regression" and "intervals" in t.loc["ddp", "note"]


def test_interval_rule_bounds():
    """Consistent with a >= threshold slowdown and significant: regression; inside: same."""
    r = dict(shift=0.045, shift_low=0.03, shift_high=0.06, p_value=1e-4, noise_floor=0.03)
    assert decide(r, 0.05)[0] == "regression"
    assert decide({**r, "shift_high": 0.049}, 0.05)[0] == "same"
    assert decide({**r, "shift_low": -0.04, "noise_floor": 0.10}, 0.05)[0] == "noisy"
    assert decide({**r, "shift": 0.5, "shift_low": 0.2, "shift_high": 0.8, "noise_floor": 0.6}, 0.05)[0] == \
        "regression"


def test_shift_interval_covers():
    """The 1-alpha interval covers a known shift about 1-alpha of the time (exact for n <= 40)."""
    rng = np.random.default_rng(0)
    cover = 0
    for _ in range(300):
        a, b = np.exp(rng.normal(0, 0.05, 12)), np.exp(rng.normal(np.log(1.03), 0.05, 9))
        t = shift_test(a, b)
        cover += t["shift_low"] <= 0.03 <= t["shift_high"]
    assert cover / 300 >= 1 - 2 * ALPHA






def test_fewest_repeats_that_can_fail():
    """Exact two-sided Mann-Whitney at alpha 0.02: 4 against 4 cannot reach it (the smallest p is
    2/70 = 0.029), 5 against 5 can (2/252 = 0.0079); so 5 repeats a side is the least the gate
    needs to call anything a regression."""
    assert min_samples() == 5
    four = shift_test(np.arange(1.0, 5.0), np.arange(5.0, 9.0))
    assert four["p_value"] == pytest.approx(2 / 70) and four["p_value"] > ALPHA
    assert shift_test(np.arange(1.0, 6.0), np.arange(6.0, 11.0))["p_value"] == pytest.approx(2 / 252)


@pytest.mark.parametrize("text, frac", [("5%", 0.05), ("0.05", 0.05), ("12.5%", 0.125), ("0.999", 0.999)])
def test_threshold_parsing(text, frac):
    assert parse_threshold(text) == pytest.approx(frac)


@pytest.mark.parametrize("text, needle", [("five", "'five'"), ("5", "ambiguous.*5%.*0.05"), ("1", "ambiguous"),
                                          ("100%", "between 0% and 100%")])
def test_bad_threshold(text, needle):
    with pytest.raises(UserError, match=needle):
        parse_threshold(text)




def test_a_cell_whose_settings_changed_is_one_incomparable_row():
    """Seen comparing new and old defaults on 4 H100s (docs/evidence/defaults-new-vs-old-h100-x4.parquet):
    each changed cell showed as a `missing` and a `new` row; it is one cell with other settings, and the row
    says which."""
    base = make_run({"fsdp": 1.0, "ddp": 1.0}, option_fsdp_mp="off")
    cur = make_run({"fsdp": 0.9, "ddp": 1.0}, option_fsdp_mp="auto", seed=1)
    base[0].loc[base[0].strategy == "ddp", "option_fsdp_mp"] = None
    cur[0].loc[cur[0].strategy == "ddp", "option_fsdp_mp"] = None
    t = cmp(base, cur)
    assert len(t) == 2 and t.loc["ddp", "verdict"] == "same"
    assert t.loc["fsdp", "verdict"] == "incomparable"
    assert t.loc["fsdp", "note"] == ("settings differ: option_fsdp_mp off -> auto: measure both sides with the same "
                                     "strategy settings (--option), or keep this pair as a new baseline")
    assert "_diffs" not in t
    assert t.loc["fsdp", "change"] == pytest.approx(1 / 0.9 - 1)  # both sides kept
    assert not failed(t.reset_index())


def test_a_cell_trained_another_way_is_incomparable_naming_the_knob():
    """A run recorded before the training knobs (no optimizer column: SGD) against one with AdamW:
    an incomparable row per cell that says which knob differs and what makes it go away; with
    nothing else in common, the one-line error says the same."""
    base = make_run({"ddp": 1.0, "fsdp": 1.0})
    cur = make_run({"ddp": 0.9, "fsdp": 1.0}, optimizer="adamw", compile="off", ac="none", seed=1)
    cur[0].loc[cur[0].strategy == "fsdp", "optimizer"] = "sgd"
    t = cmp((upgrade(base[0])[0], base[1]), cur)
    assert t.loc["fsdp", "verdict"] == "same" and t.loc["ddp", "verdict"] == "incomparable"
    why = ("training differ: optimizer sgd -> adamw: measure both sides with the same training knobs (--optimizer, "
           "--compile, --ac), or keep this pair as a new baseline")
    assert t.loc["ddp", "note"] == why
    cur[0]["optimizer"] = "adamw"
    with pytest.raises(UserError, match=re.escape(f"incomparable: {why}")):
        cmp((upgrade(base[0])[0], base[1]), cur)


def test_too_few_repeats_give_no_interval_rather_than_an_infinite_one():
    t = cmp(make_run({"ddp": 1.0}, repeats=3, n=5), make_run({"ddp": 1.0}, repeats=3, n=5, seed=1))
    r = t.loc["ddp"]
    assert r["verdict"] == "noisy" and np.isnan(r["noise_floor"]) and np.isnan(r["shift_low"])
    assert "3 repeats a side cannot bound the interval" in r["note"] and "5 repeats a side" in r["note"]


def test_a_one_rank_cell_dropped_from_the_matrix_is_missing_not_broken():
    """A baseline recorded before one-rank cells ran under one backend has their Gloo row ok; the new
    run skips it by design (one rank has no one to talk to): that must not fail the gate."""
    from bench.core.spec import ONE_RANK_SKIP

    base = make_run({"ddp": 1.0, "fsdp": 1.0})
    cur = make_run({"ddp": 1.0, "fsdp": 1.0}, statuses={"ddp": "skipped", "fsdp": "skipped"}, seed=1)
    cur[0].loc[cur[0]["strategy"] == "ddp", "reason"] = f"{ONE_RANK_SKIP}: its gloo cell would repeat the nccl one"
    cur[0].loc[cur[0]["strategy"] == "fsdp", "reason"] = "needs world size >= 2, got 1"
    t = cmp(base, cur)
    assert t.loc["ddp", "verdict"] == "missing" and "no longer in the matrix" in t.loc["ddp", "note"]
    assert t.loc["fsdp", "verdict"] == "broken"  # any other skip of a cell that ran is still a breakage


def test_a_shift_measured_under_different_loads_is_noisy_naming_the_loads():
    """The same code measured once on a quiet machine and once beside a busy loop shifted by 48% in
    the guide's CI command: the load, not the code, moved it. A verdict needs both sides alike."""
    base = make_run({"ddp": 1.0, "fsdp": 1.0}, repeats=8, n=10)
    cur = make_run({"ddp": 1.3, "fsdp": 1.3}, repeats=8, n=10, seed=5)
    base[0]["host_other_cpu_cores"] = 0.1
    cur[0]["host_other_cpu_cores"] = [1.4, 0.2]  # ddp beside a busy loop; fsdp on a quiet machine
    cur[0]["contended"] = ["1.4 cores busy outside the benchmark", None]
    t = cmp(base, cur)
    assert t.loc["ddp", "verdict"] == "noisy", t.loc["ddp", "note"]
    assert t.loc["ddp", "note"].startswith("regression measured under different loads, not trusted: 0.1 vs 1.4 cores "
                                           "busy outside the benchmark; BASE not contended, CURRENT 1.4 cores busy")
    assert t.loc["fsdp", "verdict"] == "regression"  # alike: the verdict stands


def test_loads_are_weighed_only_where_both_sides_measured_them():
    """A base without telemetry (--sample-hz 0, a history) did not measure its load: a contended
    current side is not reason enough to call its regression noisy."""
    base = make_run({"ddp": 1.0}, repeats=8, n=10)
    cur = make_run({"ddp": 1.3}, repeats=8, n=10, seed=5)
    cur[0]["host_other_cpu_cores"], cur[0]["contended"] = 1.4, "1.4 cores busy outside the benchmark"
    assert cmp(base, cur).loc["ddp", "verdict"] == "regression"
