"""Serving statistics: latency percentiles that refuse too few samples, Little's law, imbalance.

The percentile rule follows MLPerf LoadGen's early stopping. If the true p-quantile of latency is
``x_p``, the number of recorded requests slower than ``x_p`` among ``n`` is Binomial(n, 1 - p).
A tail percentile is worth reporting only when ``n`` is large enough that, even allowing one
request above the reported value (``overlatency = 1``), the chance of the sample under-stating the
true percentile is at most ``1 - confidence``:

    smallest n with  P(Binomial(n, 1 - p) <= overlatency) <= 1 - confidence

At LoadGen's default confidence 0.99 this gives 64 requests for p90 and 662 for p99 (the numbers
LoadGen prints); :func:`min_samples` computes them rather than storing them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy.stats import binom

#: the percentiles every serving cell reports
PERCENTILES: tuple[float, ...] = (50.0, 90.0, 95.0, 99.0)
CONFIDENCE = 0.99
OVERLATENCY = 1


def min_samples(percentile: float, confidence: float = CONFIDENCE, overlatency: int = OVERLATENCY) -> int:
    """Fewest requests for which ``percentile`` (e.g. 99.0) may be reported (see the module doc)."""
    if not 0 < percentile < 100:
        raise ValueError(f"percentile {percentile} must be in (0, 100)")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence {confidence} must be in (0, 1)")
    q = 1.0 - percentile / 100.0
    # a lower bound from the zero-overlatency case, then walk up: the cdf falls monotonically in n
    n = max(1, int(math.floor(math.log(1 - confidence) / math.log(1 - q))))
    while binom.cdf(overlatency, n, q) > 1 - confidence:
        n += 1
    return n


def percentiles(values: Sequence[float] | np.ndarray, *, confidence: float = CONFIDENCE) -> dict[str, float | int]:
    """``{"n": n, "p50": .., "p90": .., ...}`` of ``values``; a percentile with fewer than
    :func:`min_samples` values is NaN (refused, not guessed). Uses the inverted-CDF definition (an
    observed value, never an interpolation between two)."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    out: dict[str, float | int] = {"n": int(v.size)}
    for p in PERCENTILES:
        key = f"p{p:g}"
        out[key] = float(np.percentile(v, p, method="inverted_cdf")) \
            if v.size and v.size >= min_samples(p, confidence) else float("nan")
    return out


def refused(n: int, confidence: float = CONFIDENCE) -> list[str]:
    """The percentiles that ``n`` samples are too few for, e.g. ``['p99 (needs 662)']``."""
    return [f"p{p:g} (needs {min_samples(p, confidence)})" for p in PERCENTILES if n < min_samples(p, confidence)]


def littles_law(arrival: np.ndarray, end: np.ndarray, *, trim: float = 0.1, grid: int = 20_000) \
        -> dict[str, float]:
    """Little's law L = lambda W on recorded requests, with L measured independently.

    Over the steady window (the arrival span less ``trim`` at each end): L is the number of requests
    in the system (arrived, not finished), sampled on a grid of instants; lambda the arrivals in the
    window per second; W the mean time in system of those arrivals. On consistent timestamps the two
    sides agree up to edge effects; a clock mismatch between processes or a lost request breaks it.
    """
    arrival, end = np.asarray(arrival, float), np.asarray(end, float)
    if arrival.size < 2:
        return {"L": float("nan"), "lambda_W": float("nan"), "rel_err": float("nan")}
    a0, a1 = float(arrival.min()), float(arrival.max())
    lo, hi = a0 + trim * (a1 - a0), a1 - trim * (a1 - a0)
    if hi <= lo:
        return {"L": float("nan"), "lambda_W": float("nan"), "rel_err": float("nan")}
    ts = np.linspace(lo, hi, grid)
    # in system at t: arrived at or before t, finished after t (sorted arrays and searchsorted:
    # O((n + grid) log n) rather than n x grid)
    arrived = np.searchsorted(np.sort(arrival), ts, side="right")
    finished = np.searchsorted(np.sort(end), ts, side="right")
    L = float(np.mean(arrived - finished))
    inside = (arrival >= lo) & (arrival <= hi)
    lam = float(inside.sum()) / (hi - lo)
    W = float(np.mean(end[inside] - arrival[inside])) if inside.any() else float("nan")
    lw = lam * W
    err = abs(L - lw) / lw if lw > 0 else float("nan")
    return {"L": L, "lambda": lam, "W": W, "lambda_W": lw, "rel_err": err}


#: A cell is not a steady state when the requests arriving in its last quarter spent this many times
#: longer in the system than those of its first quarter, and longer by more than GROWTH_SPAN of the
#: arrival span: the backlog grew for the whole cell, so its latencies measure the cell's length, not
#: the system. (Time in system, not only time queued before a start: a generating pipeline starts a
#: request at once and then queues its tokens between the stages.)
GROWTH, GROWTH_SPAN = 2.0, 0.1
#: Little's law is read as a flag only from this many requests: over a short cell's trimmed window
#: its two sides differ by chance (a review's simulation, 50 ms service, 36-54 requests a cell:
#: stable cells off by more than 5% in 23% of cells at 60% load, 40% at 90%; 0-1% with ~1000).
LITTLE_MIN_N = 250
#: A cell is not a steady state when its last request finished more than one typical latency (the
#: median time in system of its first quarter of arrivals) plus this fraction of the arrival window
#: after the last arrival: requests were still queued when arrivals stopped. Seen on 4 H100s: a
#: generating pipeline offered 38 req/s for 3 s served 8.6 req/s, its last request done 8.2 s after
#: the last arrival (first quarter 5.1 s), while its backlog only grew 1.7x between quarters (the
#: first quarter was already queued) and 96 requests are too few for Little's law. A steady cell
#: drains within about one latency, however long (a review's simulation: without subtracting it, a
#: no-queue cell of 1.4 s requests in a 5 s window was flagged every time).
DRAIN = 0.25


def steady_flags(arrival: Sequence[float], latency: Sequence[float], little_rel_err: float | None,
                 tolerance: float = 0.05) -> list[str]:
    """Why an open-loop cell's latencies are not those of a steady state (empty: nothing seen): the
    time in system grew from the first quarter of arrivals to the last, the cell drained for longer
    than a typical latency plus DRAIN of its arrival window after arrivals stopped, or Little's law,
    which holds for any steady system, is off by more than ``tolerance`` (read from LITTLE_MIN_N
    requests)."""
    a, w = np.asarray(arrival, float), np.asarray(latency, float)
    flags = []
    if a.size >= 8:
        order = np.argsort(a)
        k = a.size // 4
        early = w[order[:k]]  # time in system of the first quarter of arrivals
        first, last = float(np.mean(early)), float(np.mean(w[order[-k:]]))
        span = float(a.max() - a.min())
        if last > GROWTH * first and last - first > GROWTH_SPAN * span:
            flags.append(f"backlog grew over the cell ({first * 1e3:.0f} -> {last * 1e3:.0f} ms in system): above "
                         "capacity, its latencies grow with the cell's length")
        drain = float(np.max(a + w) - a.max())
        typical = float(np.median(early))  # a steady cell drains in about one
        if span > 0 and drain - typical > DRAIN * span:
            flags.append(f"still draining {drain:.2f} s after the last arrival, {drain - typical:.2f} s "
                         f"({(drain - typical) / span:.0%} of the {span:.2f} s arrival window) beyond a "
                         f"typical latency of {typical:.2f} s: requests were still queued when arrivals stopped")
    if a.size >= LITTLE_MIN_N and little_rel_err is not None and little_rel_err == little_rel_err \
            and little_rel_err > tolerance:
        flags.append(f"Little's law off by {little_rel_err:.0%}: not a steady state")
    return flags


#: A cell kept up when it answered at least this share of the requests that arrived per second.
KEPT_UP = 0.9


def kept_up(achieved_rps: float | None, arrival: Sequence[float], offered_rps: float | None = None) -> bool:
    """The cell answered at least KEPT_UP of the arrival rate it was given: the rate its requests
    actually arrived at ((n - 1) / their arrival window), not the nominal one, which a seeded Poisson
    draw misses by its own sampling error (on 4 H100s, tenth stop, the 700-arrival draw came in at
    0.949 of the nominal rate at every rate, since one draw is scaled across rates: against the nominal
    rate every point started 5% down). The nominal rate stands in where the arrivals give no window.
    True when nothing is known to compare."""
    if not achieved_rps:
        return True
    a = np.asarray(arrival, float)
    window = float(a.max() - a.min()) if a.size >= 2 else 0.0
    rate = (a.size - 1) / window if window > 0 else offered_rps
    return not rate or achieved_rps >= KEPT_UP * rate


def meets_target(row: dict, arrival: Sequence[float], slo_s: float, *, open_loop: bool) -> bool:
    """A sweep point passes: its p99 is reported and within ``slo_s`` and, open loop, it kept up with
    the rate its requests arrived at (:func:`kept_up`) and its backlog was steady (``row["stable"]``
    from :func:`steady_flags`: a backlog that grew or did not drain is above capacity whatever a
    short cell's p99 says)."""
    p99 = row.get("latency_p99_s")
    if p99 is None or p99 != p99 or p99 > slo_s:
        return False
    if not open_loop:  # a closed loop sends when its clients are answered: its rate is its achieved rate
        return True
    if not kept_up(row.get("serve_achieved_rps"), arrival, row.get("serve_offered_rps")):
        return False
    return row.get("stable") is not False


def imbalance(values: Sequence[float]) -> float:
    """max / mean of per-device values (1.0 = perfectly even); NaN for none or an all-zero set."""
    v = np.asarray(values, float)
    if v.size == 0 or not np.isfinite(v).all() or v.mean() <= 0:
        return float("nan")
    return float(v.max() / v.mean())
