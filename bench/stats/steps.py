"""Step-time statistics that admit noise: repeats, intervals, and the flags that say when a
number should not be trusted.

A cell's timed steps are correlated (a slow phase of the machine slows many steps in a row), so an
interval bootstrapped from steps is too narrow. With repeats (the cell measured several times,
interleaved with the other cells of its group) the interval comes from the per-repeat medians,
which are closer to independent. The library does the resampling (``scipy.stats.bootstrap``, BCa
where there are enough values); the rules here only decide what to resample and what to flag.
scipy is imported where it is used: the ranks import this module for :func:`timed_median` and
:func:`slowest_steps`, and a rank's start-up should not pay a second for scipy.stats.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

#: a cell is ``stable`` when all of these hold
CV_MAX, SPREAD_MAX, OUTLIER_FRAC_MAX, BIMODAL_BC = 0.05, 0.05, 0.10, 0.555
#: fewest pooled steps for a p95 (below it, the "p95" is one of the two largest values)
P95_MIN_STEPS = 40
#: scaling efficiency above this is physically implausible here: flagged, never shown as a plain number
EFFICIENCY_MAX = 1.05


def median_ci(x: np.ndarray, *, level: float = 0.95, seed: int = 0) -> tuple[float, float, str]:
    """(low, high, method) interval of the median of ``x``: BCa bootstrap (scipy) from 10 values,
    percentile bootstrap from 3, the range below that."""
    x = np.asarray(x, dtype=float)
    if x.size == 0:
        return math.nan, math.nan, "none"
    if x.size < 3 or np.ptp(x) == 0:
        return float(x.min()), float(x.max()), "range"
    from scipy import stats

    method = "BCa" if x.size >= 10 else "percentile"
    with warnings.catch_warnings():  # BCa on tied data warns and returns NaN: handled below
        warnings.simplefilter("ignore")
        res = stats.bootstrap((x,), np.median, confidence_level=level, n_resamples=2000, method=method,
                              random_state=np.random.default_rng(seed), vectorized=True, axis=-1)
    lo, hi = res.confidence_interval
    if not (np.isfinite(lo) and np.isfinite(hi)):  # BCa degenerates on heavily tied data
        lo, hi = np.percentile(x, [2.5, 97.5])
        method = "percentile"
    return float(lo), float(hi), method


def bimodality_coefficient(x: np.ndarray) -> float:
    """Sarle's bimodality coefficient (> 0.555 suggests two modes); NaN below 4 values."""
    x = np.asarray(x, dtype=float)
    n = x.size
    if n < 4 or np.ptp(x) == 0:
        return math.nan
    from scipy import stats

    g = stats.skew(x, bias=False)
    k = stats.kurtosis(x, bias=False)  # excess kurtosis
    return float((g * g + 1) / (k + 3 * (n - 1) ** 2 / ((n - 2) * (n - 3))))


def outliers(x: np.ndarray) -> int:
    """Steps beyond Tukey's far fences (3 IQR from the quartiles)."""
    x = np.asarray(x, dtype=float)
    if x.size < 4:
        return 0
    q1, q3 = np.percentile(x, [25, 75])
    iqr = q3 - q1
    return int(((x < q1 - 3 * iqr) | (x > q3 + 3 * iqr)).sum())


def slow_rank(per_rank: np.ndarray, *, factor: float = 1.15) -> int | None:
    """The rank whose median step is ``factor`` times the median of the others' (ranks x steps of
    each rank's own step times), or None."""
    per_rank = np.asarray(per_rank, dtype=float)
    if per_rank.ndim != 2 or per_rank.shape[0] < 2:
        return None
    med = np.median(per_rank, axis=1)
    worst = int(np.argmax(med))
    others = np.delete(med, worst)
    return worst if med[worst] > factor * float(np.median(others)) else None


def slowest_steps(per_rank: Sequence[Sequence[float]]) -> np.ndarray:
    """Each timed step of one repeat as the slowest rank took it (the ranks' step times, one list a
    rank, all as long)."""
    return np.array(per_rank, dtype=np.float64).max(axis=0)


def slowest_profiled_step(breakdowns: Iterable[Mapping[str, Any]]) -> float | None:
    """The slowest rank's profiled step from the ranks' breakdowns (None without one): what a
    cell's ``breakdown_gap`` holds against its timed median, itself the slowest rank's step."""
    spans = [b["profiled_step_s"] for b in breakdowns if b.get("profiled_step_s")]
    return max(spans) if spans else None


def timed_median(repeats: Sequence[np.ndarray]) -> float:
    """A cell's timed median from its repeats (each an array of per-step times, the slowest
    rank's): the median of the repeat medians from 3 repeats on, else of the pooled steps."""
    reps = [np.asarray(r, dtype=float) for r in repeats if len(r)]
    if not reps:
        return math.nan
    if len(reps) >= 3:
        return float(np.median([np.median(r) for r in reps]))
    return float(np.median(np.concatenate(reps)))


def summarize(repeats: Sequence[np.ndarray]) -> dict[str, float | int | str | bool | None]:
    """The cell's step-time statistics from its repeats (each an array of per-step times, the
    slowest rank's): median over repeats, pooled p95 and mean, the interval (from repeat medians
    when there are at least 3 repeats, else from the steps, and the column says which), and the
    noise flags."""
    reps = [np.asarray(r, dtype=float) for r in repeats if len(r)]
    if not reps:
        nan = math.nan
        return dict(step_time_median_s=nan, step_time_p95_s=nan, step_time_mean_s=nan, step_time_ci_low_s=nan,
                    step_time_ci_high_s=nan)
    pooled = np.concatenate(reps)
    medians = np.array([np.median(r) for r in reps])
    median = timed_median(reps)
    if len(reps) >= 3:
        lo, hi, method = median_ci(medians)
        basis = f"repeats ({method})"
    else:
        lo, hi, method = median_ci(pooled)
        basis = f"steps ({method})"
    cv = float(pooled.std(ddof=1) / pooled.mean()) if pooled.size > 1 and pooled.mean() > 0 else math.nan
    spread = float(np.ptp(medians) / median) if len(reps) > 1 and median > 0 else math.nan
    bc = bimodality_coefficient(pooled)
    n_out = outliers(pooled)
    reasons = []
    if cv == cv and cv > CV_MAX:
        reasons.append(f"cv {cv:.0%}")
    if spread == spread and spread > SPREAD_MAX:
        reasons.append(f"repeats spread {spread:.0%}")
    if bc == bc and bc > BIMODAL_BC and cv == cv and cv > 0.02:
        reasons.append("bimodal")
    if n_out > OUTLIER_FRAC_MAX * pooled.size:
        reasons.append(f"{n_out} outliers")
    return dict(
        step_time_median_s=median,
        step_time_p95_s=float(np.percentile(pooled, 95)) if pooled.size >= P95_MIN_STEPS else math.nan,
        step_time_mean_s=float(pooled.mean()), step_time_ci_low_s=lo, step_time_ci_high_s=hi, ci_basis=basis,
        repeats_done=len(reps), timed_steps_total=int(pooled.size), step_time_cv=cv, repeat_spread=spread,
        bimodality=bc, outlier_steps=n_out, stable=not reasons, noise="; ".join(reasons),
    )
