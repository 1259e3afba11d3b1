import numpy as np
import torch

from bench.timing import StepTimer, bootstrap_median_ci, summarize


def test_bootstrap_ci_brackets_the_median_and_is_reproducible():
    x = np.random.default_rng(1).lognormal(size=50)
    lo, hi = bootstrap_median_ci(x)
    assert lo <= np.median(x) <= hi
    assert (lo, hi) == bootstrap_median_ci(x)
    wide = bootstrap_median_ci(np.r_[x, x * 5])
    assert wide[1] - wide[0] > 0


def test_summary_statistics():
    s = summarize(np.array([1.0, 2.0, 3.0, 4.0, 100.0]))
    assert s["step_time_median_s"] == 3.0
    assert s["step_time_p95_s"] == np.percentile([1, 2, 3, 4, 100], 95)
    assert s["step_time_ci_low_s"] <= 3.0 <= s["step_time_ci_high_s"]
    assert np.isnan(summarize(np.array([]))["step_time_median_s"])


def test_cpu_timer_measures_each_call():
    t = StepTimer(torch.device("cpu"), barrier=False)
    import time

    for d in (0.01, 0.03):
        t.time(lambda: time.sleep(d))  # noqa: B023
    a, b = t.times()
    assert 0.009 < a < b and b >= 0.029
