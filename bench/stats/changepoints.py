"""Change points of a series: where a piecewise-constant fit steps, and the series' quartiles.

The fit follows the idea of asv's step detection (a piecewise-constant fit under an L1 cost plus a
penalty per step, the penalty scaled by the series' own noise); here it is an exact optimal
partition by dynamic programming, which is cheap for the hundreds of commits a history holds.
"""

from __future__ import annotations

import math

import numpy as np


def quartiles(x: np.ndarray) -> tuple[float, float, float]:
    """25/50/75% quantiles, linear interpolation (np.quantile's default, without its overhead)."""
    x = np.sort(x)
    pos = np.array([0.25, 0.5, 0.75]) * (len(x) - 1)
    lo = np.floor(pos).astype(int)
    hi = np.minimum(lo + 1, len(x) - 1)
    q = x[lo] + (x[hi] - x[lo]) * (pos - lo)
    return float(q[0]), float(q[1]), float(q[2])



def detect_steps(y: np.ndarray, penalty: float | None = None) -> list[int]:
    """Start indices of the segments of the best piecewise-constant L1 fit of ``y`` (first is 0).

    Minimises sum over segments of (sum |y - median(segment)|) + penalty * (segments - 1), exactly,
    by optimal partitioning. The default penalty is 3 * sigma * ln(n + 1), sigma the noise of the
    series estimated from successive differences (robust to the steps themselves)."""
    y = np.asarray(y, float)
    n = len(y)
    if n < 3:
        return [0]
    if penalty is None:
        d = np.diff(y)
        sigma = 1.4826 * np.median(np.abs(d - np.median(d))) / math.sqrt(2)
        penalty = 3 * max(sigma, 1e-3 * float(np.median(np.abs(y))) + 1e-12) * math.log(n + 1)
    cost = np.empty((n + 1, n + 1))  # cost[i, j]: L1 cost of y[i:j]
    for i in range(n):
        for j in range(i + 1, n + 1):
            seg = y[i:j]
            cost[i, j] = np.abs(seg - np.median(seg)).sum()
    best = np.full(n + 1, np.inf)
    best[0] = -penalty
    prev = np.zeros(n + 1, int)
    for j in range(1, n + 1):
        cand = best[:j] + cost[:j, j] + penalty
        prev[j] = int(np.argmin(cand))
        best[j] = cand[prev[j]]
    starts, j = [], n
    while j > 0:
        starts.append(prev[j])
        j = prev[j]
    return sorted(starts)
