"""Distribution-free intervals from order statistics, without scipy.

The ranks use :func:`order_stat_halfwidth` to decide whether to take more steps; this module
imports only numpy and the standard library so that a rank process does not pay scipy's import.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np


def binom_half_ppf(q: float, n: int) -> int:
    """The q-quantile of Binomial(n, 1/2): the smallest k with P(X <= k) >= q, in exact integer
    arithmetic. The ranks need it (:func:`order_stat_halfwidth`) and importing ``scipy.stats`` for
    it cost each rank process 0.56 s of its start-up on 2 CPU cores (``python -X importtime``);
    ``tests/unit/test_timing.py`` checks it against ``scipy.stats.binom.ppf``."""
    if n < 0 or not 0 <= q <= 1:
        raise ValueError(f"binom_half_ppf needs n >= 0 and 0 <= q <= 1, got n={n}, q={q}")
    target = Fraction(q) * (1 << n)
    total, term = 0, 1  # term = comb(n, k)
    for k in range(n + 1):
        total += term
        if total >= target:
            return k
        term = term * (n - k) // (k + 1)
    return n


def order_stat_halfwidth(x: np.ndarray, level: float = 0.95) -> float:
    """Relative half-width of the distribution-free (binomial order statistic) interval of the
    median: cheap and deterministic, for deciding inside a rank whether to take more steps."""
    x = np.sort(np.asarray(x, dtype=float))
    n = x.size
    if n < 6:
        return math.inf
    k = binom_half_ppf((1 - level) / 2, n)
    lo, hi = x[max(k - 1, 0)], x[min(n - k, n - 1)]
    med = float(np.median(x))
    return (hi - lo) / (2 * med) if med > 0 else math.inf
