"""Percentile rule (LoadGen early stopping, derived), Little's law, imbalance."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import binom

from bench.serve.policies import RoundRobin, simulate
from bench.stats.serving import imbalance, littles_law, min_samples, percentiles, refused


def test_min_samples_reproduces_loadgen():
    assert min_samples(90) == 64
    assert min_samples(99) == 662


def test_min_samples_is_the_smallest_that_bounds_the_percentile():
    for p in (50, 90, 95, 99):
        n, q = min_samples(p), 1 - p / 100
        assert binom.cdf(1, n, q) <= 0.01 < binom.cdf(1, n - 1, q)


def test_min_samples_moves_with_confidence_and_percentile():
    assert min_samples(99, confidence=0.9) < min_samples(99) < min_samples(99, confidence=0.999)
    assert min_samples(50) < min_samples(90) < min_samples(95) < min_samples(99)
    with pytest.raises(ValueError):
        min_samples(100)


def test_percentiles_refuse_too_few_samples():
    few = percentiles(np.arange(63.0))
    assert few["n"] == 63 and not math.isnan(few["p50"]) and math.isnan(few["p90"]) and math.isnan(few["p99"])
    ok = percentiles(np.arange(1.0, 65.0))
    assert ok["p90"] == 58.0  # an observed value (inverted CDF): ceil(0.9 * 64) = 58th
    assert math.isnan(ok["p99"])
    assert percentiles(np.arange(700.0))["p99"] == 692.0  # the 693rd of 0..699
    assert refused(100) == ["p95 (needs 130)", "p99 (needs 662)"]
    assert refused(1000) == []


def _mm1(rate, service, n, seed=0):
    rng = np.random.default_rng(seed)
    arr = np.cumsum(rng.exponential(1 / rate, n))
    res = simulate(RoundRobin(1), arr, [service])
    return arr, res.end


def test_littles_law_holds_on_a_stable_queue():
    arr, end = _mm1(rate=50, service=0.012, n=4000)  # utilisation 0.6
    ll = littles_law(arr, end)
    assert ll["rel_err"] < 0.05
    assert ll["L"] > 0.5  # a real queue, not an empty system


def test_littles_law_breaks_when_the_run_is_not_stationary():
    # arrivals twice the service capacity: the queue grows all run long, the window's L and the
    # window arrivals' W disagree by far more than 5%
    arr, end = _mm1(rate=100, service=0.02, n=2000)
    assert littles_law(arr, end)["rel_err"] > 0.05


def test_imbalance():
    assert imbalance([1, 1, 1]) == 1.0
    assert imbalance([3, 1]) == 1.5
    assert math.isnan(imbalance([]))


def test_a_cell_whose_backlog_grows_is_not_a_steady_state():
    from bench.serve.steady import steady_flags

    arrival = [i * 0.1 for i in range(40)]  # a 3.9 s cell
    steady = [0.010 + 0.005 * (i % 3) for i in range(40)]  # time in system stays small
    assert steady_flags(arrival, steady, little_rel_err=0.01) == []
    growing = [0.01 + 0.05 * i for i in range(40)]  # above capacity: each request waits longer
    flags = steady_flags(arrival, growing, little_rel_err=0.3)
    assert len(flags) == 2, flags  # 40 requests: no Little
    assert flags[0].startswith("backlog grew over the cell (235 -> 1735 ms in system)"), flags  # quarters of 10
    assert flags[1].startswith("still draining 1.96 s after the last arrival, 1.72 s (44% of the 3.90 s arrival "
                               "window) beyond a typical latency of 0.24 s"), flags
    many = [i * 0.01 for i in range(300)]
    assert steady_flags(many, [0.01] * 300, little_rel_err=0.3) == ["Little's law off by 30%: not a steady state"]
    assert steady_flags(many, [0.01] * 300, little_rel_err=0.04) == []
    # doubling by less than a tenth of the span is a busy but steady system; too few requests say nothing
    assert steady_flags(arrival, [0.01 + 0.03 * (i >= 30) for i in range(40)], 0.0) == []
    assert steady_flags(arrival[:5], growing[:5], None) == []


def test_a_cell_still_draining_long_after_its_arrivals_is_not_a_steady_state():
    """A generating pipeline as on 4 H100s: offered 38 req/s for 3 s, 96 requests, time
    in system 5.1 s in the first quarter and 8.5 s in the last (under the 2x growth rule: the first
    quarter already queued), too few requests for Little's law; its last request ended 8.2 s after
    the last arrival."""
    from bench.serve.steady import steady_flags

    arrival = [i * 3.0 / 95 for i in range(96)]
    latency = [5.1 + 3.4 * i / 95 for i in range(96)]
    flags = steady_flags(arrival, latency, little_rel_err=0.80)
    assert len(flags) == 1, flags
    assert flags[0].startswith("still draining 8.50 s after the last arrival, 2.99 s (100% of the 3.00 s"), flags
    # a steady cell drains within about one latency, however long: 20 ms, or 1.4 s (no queue at all)
    assert steady_flags(arrival, [0.02] * 96, little_rel_err=0.80) == []
    assert steady_flags(arrival, [1.4] * 96, little_rel_err=None) == []
    # a queue that built up at the end: the last tenth of the arrivals waited 1 s more than the rest
    tail = [0.02 + 1.0 * (i >= 86) for i in range(96)]
    assert [f[:14] for f in steady_flags(arrival, tail, little_rel_err=None)] == ["backlog grew o", "still draining"]


def test_a_no_queue_cell_whose_latency_exceeds_a_quarter_of_its_window_is_steady():
    """Every request takes 1.4 s and none waits (a generating model with free slots at 2 req/s): a
    long service time alone is not a growing backlog, so the drain rule calls the cell steady."""
    import numpy as np

    from bench.serve.steady import steady_flags

    rng = np.random.default_rng(0)
    a = np.cumsum(rng.exponential(0.5, 40))
    a = a[a < 5.0] - a[0]
    assert a.size >= 8
    assert steady_flags(a, [1.4] * a.size, None) == []


def test_kept_up_compares_with_the_rate_the_requests_arrived_at():
    """A seeded 700-arrival Poisson draw can come in at 0.949 of the nominal rate: a steady batching
    cell at 3,856 req/s nominal (3,657.7 realised) answering 3,470.2 req/s is 0.8999 of nominal but
    0.949 of the realised rate, and it kept up."""
    from bench.serve.steady import kept_up

    arrivals = [i / 3657.7 for i in range(700)]  # 699 gaps over the window: 3,657.7 req/s
    assert kept_up(3470.2, arrivals, 3856.0)
    assert not kept_up(3470.2 * 0.8 / 0.949, arrivals, 3856.0)  # 80% of what arrived: behind
    # no window to read (fewer than two arrivals, or all at once): the nominal rate decides
    assert not kept_up(3470.2, [0.0], 3856.0) and kept_up(3500.0, [0.0, 0.0], 3856.0)
    assert kept_up(None, arrivals, 3856.0) and kept_up(100.0, [], None)  # nothing to compare


def test_the_sweep_climbs_the_ladder_then_bisects_to_the_last_passing_rate():
    """A server whose p99 meets 100 ms up to 1,000 req/s and whose backlog stops being steady above
    1,200: the ladder from 100 req/s doubles to the first failure (1,600), three bisection steps
    narrow it between 800 and 1,600 (1,200 passes, 1,400 fails, 1,300 fails), and the answer is
    1,200; a point that meets p99 but is not steady fails (the slo_met a cell row carries)."""
    from bench.serve.config import ServeConfig
    from bench.serve.sweep import run_sweep

    cfg = ServeConfig(rates=[100.0], slo_ms=100.0)
    seen = []

    def cell(load):
        seen.append(load.rate)
        return {"status": "ok", "slo_met": load.rate <= 1200, "latency_p99_s": 0.01 if load.rate <= 1000 else 0.05}

    out = run_sweep(cell, cfg, None)
    assert seen == [100, 200, 400, 800, 1600, 1200, 1400, 1300]
    assert out["max_rate_rps"] == 1200 and out["first_failing_rps"] == 1300
    assert [t["pass"] for t in out["tried"]] == [True] * 4 + [False, True, False, False]
    # nothing passes: no rate, and a note says why
    none = run_sweep(lambda load: {"status": "ok", "slo_met": False}, cfg, None)
    assert none["max_rate_rps"] is None and "no rate tried met the target" in none["note"]


def test_a_sweep_point_needs_its_p99_its_throughput_and_a_steady_backlog():
    from bench.serve.steady import meets_target

    arrivals = [i / 1000 for i in range(701)]  # 1,000 req/s realised
    ok = {"latency_p99_s": 0.012, "serve_achieved_rps": 990.0, "serve_offered_rps": 1050.0, "stable": True}
    assert meets_target(ok, arrivals, 0.1, open_loop=True)
    assert not meets_target({**ok, "latency_p99_s": 0.2}, arrivals, 0.1, open_loop=True)
    assert not meets_target({**ok, "latency_p99_s": None}, arrivals, 0.1, open_loop=True)  # refused: < 662
    assert not meets_target({**ok, "latency_p99_s": float("nan")}, arrivals, 0.1, open_loop=True)
    assert not meets_target({**ok, "serve_achieved_rps": 850.0}, arrivals, 0.1, open_loop=True)
    # Little's law off or a growing backlog: not steady, fails open loop; a closed loop is bounded
    assert not meets_target({**ok, "stable": False}, arrivals, 0.1, open_loop=True)
    assert meets_target({**ok, "stable": False}, arrivals, 0.1, open_loop=False)
    # closed loop: its sends follow its answers (32 clients, 96 requests in 3 latencies sent 95 over
    # two), so no arrival rate is there to keep up with; only its p99 counts
    closed = {"latency_p99_s": 0.012, "serve_achieved_rps": 32 / 0.01}
    assert meets_target(closed, [0.0] * 32 + [0.01] * 32 + [0.02] * 32, 0.1, open_loop=False)
