"""Two-sample tests of a shift in step time, with distribution-free intervals.

The change between two samples is the Hodges-Lehmann shift of log time (a ratio, so cells of any
speed share one scale) with its confidence interval from the Mann-Whitney inversion (exact null
distribution of U up to 40 values a side, normal approximation above). Against a history of
per-run medians, :func:`run_test` is a t prediction test on log time whose spread is the run-to-run
noise itself. The verdict rules that read these numbers are in :mod:`bench.gate.compare`.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
from scipy import stats

from bench.core.errors import UserError

#: two-sided level of the test and 1 - coverage of the interval: an A/A pair fails with p <= ALPHA/2
ALPHA = 0.02


@lru_cache(maxsize=256)
def _u_cdf(n: int, m: int) -> np.ndarray:
    """P(U <= u) for u = 0..n*m under the null, exact (no ties), by the counting recurrence
    c(i, j, u) = c(i-1, j, u-j) + c(i, j-1, u)."""
    prev = [np.ones(1)] * (m + 1)  # i = 0: one arrangement, U = 0
    for i in range(1, n + 1):
        row = [np.ones(1)]
        for j in range(1, m + 1):
            a = np.concatenate([np.zeros(j), prev[j]])  # x-sample i ranks above all j y-samples
            b = row[j - 1]
            c = np.zeros(i * j + 1)
            c[: len(a)] += a
            c[: len(b)] += b
            row.append(c)
        prev = row
    counts = prev[m]
    return np.cumsum(counts) / counts.sum()


def _k_low(n: int, m: int, alpha: float) -> int:
    """How many sorted pairwise differences to cut from each end for a (1 - alpha) interval:
    the number of u with P(U <= u) <= alpha/2. 0 means the interval is unbounded."""
    if n <= 40 and m <= 40:
        return int(np.searchsorted(_u_cdf(n, m), alpha / 2, side="right"))
    z = stats.norm.ppf(1 - alpha / 2)
    return max(int(math.floor(n * m / 2 - z * math.sqrt(n * m * (n + m + 1) / 12))), 0)


def min_samples(alpha: float = ALPHA) -> int:
    """The fewest samples a side for which the interval is bounded at all."""
    n = 2
    while _k_low(n, n, alpha) == 0:
        n += 1
    return n


def shift_test(base: np.ndarray, cur: np.ndarray, alpha: float = ALPHA, test: str = "mannwhitneyu") -> dict:
    """Relative change of ``cur`` over ``base`` (positive: slower) with its (1 - alpha) interval,
    the test's p-value and the interval's width (the noise floor: the smallest change this pair
    resolves)."""
    lb, lc = np.log(np.asarray(base, float)), np.log(np.asarray(cur, float))
    n, m = len(lc), len(lb)
    d = np.sort((lc[:, None] - lb[None, :]).ravel())
    k = _k_low(n, m, alpha)
    lo, hi = (d[k - 1], d[len(d) - k]) if k >= 1 else (-np.inf, np.inf)
    if test == "brunnermunzel":
        p = stats.brunnermunzel(lc, lb).pvalue
        if not np.isfinite(p):  # complete separation: B-M's variance is 0; take the exact rank test
            p = stats.mannwhitneyu(lc, lb, alternative="two-sided").pvalue
    elif test == "mannwhitneyu":
        p = stats.mannwhitneyu(lc, lb, alternative="two-sided").pvalue
    else:
        raise UserError(f"test {test!r} is not known; use mannwhitneyu or brunnermunzel")
    lo_r, hi_r = math.expm1(lo), math.expm1(hi)
    return dict(shift=math.expm1(float(np.median(d))), shift_low=lo_r, shift_high=hi_r,
                p_value=float(p), noise_floor=hi_r - lo_r, n_base=m, n_cur=n)


def run_test(base_runs: np.ndarray, cur: np.ndarray, alpha: float = ALPHA) -> dict:
    """CURRENT (one run's median, or its per-repeat medians) against the per-run medians of a
    history: a t prediction test on log time, whose spread is the run-to-run noise itself, so
    drift between runs is in the noise floor rather than in the verdict."""
    b, c = np.log(np.asarray(base_runs, float)), np.log(np.asarray(cur, float))
    k, n = len(b), len(c)
    sd = max(float(np.std(b, ddof=1)), 1e-9)
    # CURRENT is one run: its repeats share that run's drift, so it counts as one draw of the
    # run-to-run spread whatever its repeat count (n only sets what is reported).
    se = sd * math.sqrt(1 / k + 1)
    d = float(c.mean() - b.mean())
    p = 2 * stats.t.sf(abs(d) / se, k - 1)
    half = stats.t.ppf(1 - alpha / 2, k - 1) * se
    lo, hi = math.expm1(d - half), math.expm1(d + half)
    return dict(shift=math.expm1(d), shift_low=lo, shift_high=hi, p_value=float(p), noise_floor=hi - lo,
                n_base=k, n_cur=n)


def runs_needed(base_runs: np.ndarray, threshold: float, alpha: float = ALPHA) -> int | None:
    """History runs that bring :func:`run_test`'s interval under the threshold, or None when no
    number would (one new run's own drift, the history's run-to-run spread, is wider than the
    threshold: the machine is too noisy for it)."""
    b = np.log(np.asarray(base_runs, float))
    sd = max(float(np.std(b, ddof=1)), 1e-9)
    for k in range(max(len(b), 3), 1000):
        if 2 * stats.t.ppf(1 - alpha / 2, k - 1) * sd * math.sqrt(1 / k + 1) <= threshold:
            return k
    return None


def samples_needed(base: np.ndarray, cur: np.ndarray, width: float, threshold: float,
                   alpha: float = ALPHA) -> int:
    """Samples a side that would bring the interval's width under the threshold (with a 20%
    margin): the width shrinks as 1/sqrt(n). An unbounded interval is sized from the samples'
    robust spread instead."""
    n = min(len(base), len(cur))
    if np.isfinite(width) and width > 0:
        est = n * (width * 1.2 / threshold) ** 2
    else:
        lg = [np.log(np.asarray(x, float)) for x in (base, cur)]
        sigma = max(stats.median_abs_deviation(np.concatenate([x - np.median(x) for x in lg]), scale="normal"),
                    1e-6)
        z = stats.norm.ppf(1 - alpha / 2)
        # width of the shift interval ~ 2 z sigma sqrt(2/n) / efficiency(0.95) for a rank test
        est = 2 * (2 * z * sigma * 1.2 / threshold) ** 2 / 0.95
    return int(max(math.ceil(est), min_samples(alpha), n + 1))
