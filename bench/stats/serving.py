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


def imbalance(values: Sequence[float]) -> float:
    """max / mean of per-device values (1.0 = perfectly even); NaN for none or an all-zero set."""
    v = np.asarray(values, float)
    if v.size == 0 or not np.isfinite(v).all() or v.mean() <= 0:
        return float("nan")
    return float(v.max() / v.mean())
