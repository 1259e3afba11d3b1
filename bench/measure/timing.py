"""Step timing (the statistics, the order-statistic interval included, are in :mod:`bench.stats`).

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

import time
from collections.abc import Callable

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
