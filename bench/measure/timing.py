"""Step timing (the statistics are in :mod:`bench.stats`).

On CUDA each step is bracketed by CUDA events on the current stream (no host sync inside the
loop); on CPU ``perf_counter`` brackets the step. Neither adds a synchronisation that a training
loop would not have: the ranks start the timed window together (one barrier before it, in
:mod:`bench.train.timed`) and then run free, as a plain loop does. (A barrier before every CPU
step would keep a pipeline's stages from overlapping one step's tail with the next step's head
and leave the barrier's wait out of the step: against the plain loops on gloo, gpt-tiny, 2 ranks,
3-4 interleaved rounds, harness / plain is 1.198 [1.143, 1.262] for 1F1B and 0.743 [0.602, 0.858]
for DDP with such a barrier; 0.769 [0.735, 1.388] and 1.012 [0.521, 1.139] without.) The step
time a cell reports is the maximum over ranks of each step, since the slowest rank sets the pace.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from fractions import Fraction

import numpy as np
import torch


class StepTimer:
    """Times ``n`` calls of ``fn``; ``times()`` returns seconds per call after they all finished."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self._events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        self._cpu: list[float] = []
        self._cpu_starts: list[float] = []

    def time(self, fn: Callable[[], object]) -> object:
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = fn()
            end.record()
            self._events.append((start, end))
            return out
        t0 = time.perf_counter()
        self._cpu_starts.append(time.time())
        out = fn()
        self._cpu.append(time.perf_counter() - t0)
        return out

    def times(self) -> list[float]:
        if self.cuda:
            torch.cuda.synchronize()
            return [s.elapsed_time(e) / 1e3 for s, e in self._events]
        return list(self._cpu)


    def starts(self, t0: float) -> list[float]:
        """Unix start time of each step. On CUDA the steps run back to back on the device from
        ``t0`` (taken after a synchronize), so start k is t0 + the durations before it."""
        if not self.cuda:
            return list(self._cpu_starts)
        out, t = [], t0
        for d in self.times():
            out.append(t)
            t += d
        return out


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
