import time

import numpy as np
import torch

from bench.measure.timing import StepTimer
from bench.stats.intervals import order_stat_halfwidth
from bench.stats.steps import bimodality_coefficient, median_ci, outliers, slow_rank, summarize


def test_median_interval_brackets_the_median_and_is_reproducible():
    x = np.random.default_rng(1).lognormal(size=50)
    lo, hi, method = median_ci(x)
    assert lo <= np.median(x) <= hi and method == "BCa"
    assert (lo, hi, method) == median_ci(x)
    wide = median_ci(np.r_[x, x * 5])
    assert wide[1] - wide[0] > hi - lo
    assert median_ci(np.array([1.0, 2.0]))[2] == "range"


def test_interval_comes_from_repeats_not_correlated_steps():
    rng = np.random.default_rng(0)
    # Each repeat sits at its own level (the machine drifted) with little noise inside it: the
    # steps look tight, the repeats show the real uncertainty.
    reps = [1.0 + d + rng.normal(0, 0.001, 30) for d in (0.0, 0.08, 0.16)]
    s = summarize(reps)
    assert s["ci_basis"].startswith("repeats") and s["repeats_done"] == 3
    assert s["step_time_ci_high_s"] - s["step_time_ci_low_s"] >= 0.15
    assert s["repeat_spread"] > 0.1 and not s["stable"] and "repeats spread" in s["noise"]
    one = summarize([np.concatenate(reps)])
    assert one["ci_basis"].startswith("steps")


def test_bimodal_stream_is_flagged():
    rng = np.random.default_rng(3)
    x = np.r_[rng.normal(0.040, 0.001, 30), rng.normal(0.320, 0.005, 30)]  # two modes: 40 and 320 ms steps
    assert bimodality_coefficient(x) > 0.555
    s = summarize([x])
    assert not s["stable"] and "bimodal" in s["noise"]
    steady = summarize([rng.normal(0.1, 0.001, 60)])
    assert steady["stable"] and steady["noise"] == ""


def test_outliers_and_p95_needs_enough_steps():
    x = np.r_[np.full(30, 0.1), [1.0, 2.0]]
    assert outliers(x) == 2
    assert np.isnan(summarize([x])["step_time_p95_s"])  # 32 steps: a "p95" would be a maximum
    assert np.isfinite(summarize([np.full(50, 0.1)])["step_time_p95_s"])


def test_synthetic_slow_rank_is_found():
    rng = np.random.default_rng(5)
    ranks = rng.normal(0.1, 0.002, size=(4, 20))
    assert slow_rank(ranks) is None
    ranks[2] *= 1.4
    assert slow_rank(ranks) == 2


def test_order_statistic_halfwidth_shrinks_with_steps():
    rng = np.random.default_rng(7)
    a, b = rng.normal(1, 0.05, 10), rng.normal(1, 0.05, 200)
    assert order_stat_halfwidth(b) < order_stat_halfwidth(a) < 0.2
    assert order_stat_halfwidth(np.ones(3)) == np.inf


def test_cpu_timer_measures_each_call():
    t = StepTimer(torch.device("cpu"))
    for d in (0.01, 0.03):
        t.time(lambda: time.sleep(d))  # noqa: B023
    a, b = t.times()
    assert 0.009 < a < b and b >= 0.029


def test_ranks_tear_cupti_down_after_profiling_unless_the_user_says_otherwise(monkeypatch):
    """A profiler session leaves CUPTI attached without TEARDOWN_CUPTI=1 (measured: launch-bound
    steps 1.95x slower afterwards on an H100), and the harness profiles cells in the processes that
    measure later cells; the ranks' environment and the recorded fingerprint must both say so."""
    from bench.measure import fingerprint
    from bench.runtime.process import child_env

    monkeypatch.delenv("TEARDOWN_CUPTI", raising=False)
    assert child_env(2)["TEARDOWN_CUPTI"] == "1"
    assert fingerprint.fingerprint()["env"]["TEARDOWN_CUPTI"] == "1"
    monkeypatch.setenv("TEARDOWN_CUPTI", "0")  # a user who wants the old behaviour keeps it, and it is recorded
    assert child_env(2)["TEARDOWN_CUPTI"] == "0"
    assert fingerprint.fingerprint()["env"]["TEARDOWN_CUPTI"] == "0"


def test_the_binomial_quantile_matches_scipy():
    from scipy import stats

    from bench.stats.intervals import binom_half_ppf

    for n in [*range(0, 200), 499, 500, 1000, 2047]:
        # (at a q that a CDF value equals exactly, as 0.5 for odd n, scipy rounds in floating point)
        for q in (0.005, 0.025, 0.05, 0.3, 0.975):
            assert binom_half_ppf(q, n) == int(stats.binom.ppf(q, n, 0.5)), (q, n)
