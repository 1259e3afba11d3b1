"""Step timing and the statistics the cells table reports.

On CUDA each step is bracketed by CUDA events on the current stream (no host sync inside the
loop); on CPU a barrier lines the ranks up and ``perf_counter`` brackets the step. The step time a
cell reports is the maximum over ranks of each step, since the slowest rank sets the pace.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import torch
import torch.distributed as dist


class StepTimer:
    """Times ``n`` calls of ``fn``; ``times()`` returns seconds per call after they all finished."""

    def __init__(self, device: torch.device, *, barrier: bool):
        self.cuda = device.type == "cuda"
        self.barrier = barrier and dist.is_initialized()
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
        if self.barrier:
            dist.barrier()
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


def bootstrap_median_ci(x: np.ndarray, *, n_boot: int = 2000, level: float = 0.95,
                        seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of the median (fixed seed: the same data gives the same CI)."""
    x = np.asarray(x, dtype=float)
    if x.size == 0:
        return float("nan"), float("nan")
    if x.size == 1:
        return float(x[0]), float(x[0])
    rng = np.random.default_rng(seed)
    meds = np.median(rng.choice(x, size=(n_boot, x.size), replace=True), axis=1)
    a = (1 - level) / 2
    return float(np.quantile(meds, a)), float(np.quantile(meds, 1 - a))


def summarize(step_times: np.ndarray) -> dict[str, float]:
    """median, p95, mean and the bootstrap 95% CI of the median of per-step times (seconds)."""
    x = np.asarray(step_times, dtype=float)
    if x.size == 0:
        nan = float("nan")
        return dict(step_time_median_s=nan, step_time_p95_s=nan, step_time_mean_s=nan,
                    step_time_ci_low_s=nan, step_time_ci_high_s=nan)
    lo, hi = bootstrap_median_ci(x)
    return dict(step_time_median_s=float(np.median(x)), step_time_p95_s=float(np.percentile(x, 95)),
                step_time_mean_s=float(x.mean()), step_time_ci_low_s=lo, step_time_ci_high_s=hi)
