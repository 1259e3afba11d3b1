"""A cell's timed measurement on one rank: the adaptive warm-up, the timed steps, and their window,
energy and peak memory.

Both loops run the asked steps, then more in chunks of :data:`CHUNK`; between chunks the ranks agree
on the step times and the deadline (:func:`agreed`), so every rank takes the same decision.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from bench.core import backends, spec
from bench.core.spec import CellSpec, Measure, RankMeasurement
from bench.measure.nvml import EnergyMeter, process_used_bytes
from bench.measure.timing import StepTimer
from bench.stats.intervals import order_stat_halfwidth
from strategies.training import checkpointed_forwards

CHUNK = 5  # steps between decisions of the adaptive warm-up and timed loops


def agreed(times: list[float], backend: backends.Backend, device: torch.device,
           deadline: float | None = None) -> tuple[np.ndarray, bool]:
    """Each step's time as the slowest rank saw it, and whether any rank is past ``deadline``,
    known to every rank, so that all ranks take the same decision (one small all-reduce, between
    chunks, outside the timed steps)."""
    late = float(deadline is not None and time.time() > deadline)
    t = torch.tensor([*times, late], dtype=torch.float64, device=device if backend.bind_device else "cpu")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    x = t.cpu().numpy()
    return x[:-1], bool(x[-1])


def past_deadline(deadline: float | None) -> bool:
    """``deadline`` (the run's time budget, unix time) has passed by rank 0's clock, known to every
    rank (one broadcast), so that all ranks stop at the same point. The adaptive loops fold the same
    question into :func:`agreed`, whose all-reduce they make anyway."""
    if deadline is None:
        return False
    late = [time.time() > deadline]
    dist.broadcast_object_list(late, src=0)
    return bool(late[0])


def chunk_within(x: np.ndarray | None, left: int, allowance_s: float | None) -> int:
    """Steps of the next chunk of an adaptive loop: CHUNK, no more than ``left``, and, with an
    allowance, no more than the latest step time says fit in what the steps ``x`` left of it (at
    least one while any is left; 0 once it is spent)."""
    n = min(CHUNK, max(left, 0))
    if allowance_s is None or x is None or not x.size or n == 0:
        return n
    rest = allowance_s - float(x.sum())
    if rest <= 0:
        return 0
    per = float(x[-1])
    return n if per <= 0 else max(1, min(n, int(np.ceil(rest / per))))


def settled(x: np.ndarray, tol: float) -> bool:
    """The median of the last CHUNK steps moved less than ``tol`` from the CHUNK before."""
    if x.size < 2 * CHUNK:
        return False
    a, b = float(np.median(x[-CHUNK:])), float(np.median(x[-2 * CHUNK:-CHUNK]))
    return b > 0 and abs(a - b) / b < tol


class Steps:
    """A cell's training steps in order, step s on staged batch s (cycling), with each step's loss."""

    def __init__(self, step, batches: list[Any]):
        self.step, self.batches = step, batches
        self.losses: list[Any] = []

    def run(self, timer: StepTimer, n: int) -> None:
        for _ in range(n):
            s = len(self.losses)
            self.losses.append(timer.time(lambda: self.step.run(self.batches[s % len(self.batches)])))  # noqa: B023


class Agreement:
    """What the ranks agree on between chunks: the cell's backend and device, and the run's deadline."""

    def __init__(self, backend: backends.Backend, device: torch.device, deadline: float | None):
        self.backend, self.device, self.deadline = backend, device, deadline

    def __call__(self, timer: StepTimer) -> tuple[np.ndarray, bool]:
        return agreed(timer.times(), self.backend, self.device, self.deadline)


#: warm-up steps of a compiled cell after its compiling step, at least: later steps can still
#: compile (a recompilation for the optimizer's first real update, DDP's graph split), and settling
#: needs two chunks to compare
COMPILED_WARMUP = 2 * CHUNK


def warm_up(steps: Steps, m: Measure, agree: Agreement, compiled: bool = False) -> tuple[int, float | None]:
    """The asked warm-up steps, then more in chunks until the step time settles (or the cap);
    returns the steps taken and, for a ``compiled`` cell, its compilation seconds (the first step
    beyond the last warm-up chunk's median). Warm-up may take half the time cap, and the next
    chunk is sized to what is left of that half, so that a chunk of slow steps (seconds each on
    Gloo) does not run far past it. A compiled cell's first step compiles: it runs alone, outside
    that allowance, and at least :data:`COMPILED_WARMUP` steps follow it, adaptive until settled.
    Same decisions on every rank: the agreed times, not each rank's own clock."""
    first = None
    if compiled:
        t0 = time.perf_counter()
        steps.run(StepTimer(agree.device), 1)
        first = time.perf_counter() - t0
        m = dataclasses.replace(m, warmup=max(m.warmup, COMPILED_WARMUP),
                                warmup_max=max(m.warmup_max, 4 * COMPILED_WARMUP))
    warm = StepTimer(agree.device)
    steps.run(warm, m.warmup)
    done = _settle(steps, warm, m, agree)
    if first is None:
        return done, None
    x, _ = agree(warm)
    return done, max(first - float(np.median(x[-CHUNK:])), 0.0)


def _settle(steps: Steps, warm: StepTimer, m: Measure, agree: Agreement) -> int:
    """More warm-up steps in chunks until the step time settles, ``warmup_max`` or half the time
    cap; the steps taken in all."""
    adaptive = m.warmup_max > len(steps.losses) and m.settle > 0
    x, late = agree(warm) if adaptive else (None, False)
    while adaptive and m.warmup_max > len(steps.losses):
        n = chunk_within(x, m.warmup_max - len(steps.losses), m.time_cap_s / 2 if m.time_cap_s else None)
        if late or n == 0:
            break
        steps.run(warm, n)
        x, late = agree(warm)
        if settled(x, m.settle):
            break
    return len(steps.losses)


def time_steps(steps: Steps, m: Measure, agree: Agreement, out: RankMeasurement) -> StepTimer:
    """The asked timed steps, then more in chunks until the median's interval is narrow enough
    (``out.target_reached``), the step cap or the time cap."""
    timer = StepTimer(agree.device)
    steps.run(timer, m.steps)
    if m.steps_max > m.steps and m.target_ci > 0:
        out.target_reached = False
        while True:
            x, late = agree(timer)
            if order_stat_halfwidth(x) <= m.target_ci:
                out.target_reached = True
                break
            n = chunk_within(x, m.steps_max - x.size, m.time_cap_s or None)
            if late or n == 0:
                break
            steps.run(timer, n)
    return timer


def compile_counts(out: RankMeasurement) -> None:
    """Into ``out``: the graphs torch.compile built since the cell's build, and its graph breaks."""
    counters = torch._dynamo.utils.counters
    out.compiled_graphs = int(counters["stats"]["unique_graphs"])
    out.graph_breaks = int(sum(counters["graph_break"].values()))


def recompile_counts(out: RankMeasurement) -> None:
    """Into ``out``, after the timed steps: the graphs torch.compile built during them (a guard
    that fails every step recompiles every step), and whether dynamo reached its recompile limit
    (the code it gave up on ran eager)."""
    counters = torch._dynamo.utils.counters
    out.timed_graphs = int(counters["stats"]["unique_graphs"]) - (out.compiled_graphs or 0)
    out.recompile_limit = any("recompile limit" in str(k).lower() or "recompile_limit" in str(k)
                              for k in (*counters["unimplemented"], *counters["graph_break"]))


def measure(out: RankMeasurement, steps: Steps, cell: CellSpec, devices: tuple[torch.device, ...],
            before: list[int], backend: backends.Backend, deadline: float | None) -> None:
    """Warm up, then time ``cell``'s steps into ``out``: the warm-up taken, the step times and
    starts, the window, the energy and peak memory of the timed steps, and every step's loss."""
    m, device = cell.measure, devices[0]
    agree = Agreement(backend, device, deadline)
    out.warmup_steps, out.compile_s = warm_up(steps, m, agree, compiled=cell.training.compile == "on")
    if cell.training.compile == "on":
        compile_counts(out)
    if cell.training.ac != "none":
        out.checkpointed = checkpointed_forwards()
    meter = EnergyMeter([d.index for d in devices]) if device.type == "cuda" else None
    if device.type == "cuda":
        for d in devices:  # the peak of training, not of building the full model before sharding it
            torch.cuda.synchronize(d)
            torch.cuda.reset_peak_memory_stats(d)
    # The ranks start the timed steps together, as a plain loop does: otherwise the first timed
    # step carries the skew the warm-up left between ranks (on 4 H100s, a 125 ms first step in a
    # 45 ms DDP cell, which the noise flags report as bimodal with an outlier).
    e0 = meter.read() if meter else None  # NVML takes milliseconds: before the barrier, not after it
    dist.barrier()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.time()
    timer = time_steps(steps, m, agree, out)
    out.times = timer.times()  # synchronises the device
    if cell.training.compile == "on":
        recompile_counts(out)
    t1, e1 = time.time(), (meter.read() if meter else None)
    if device.type == "cuda":
        peaks = [torch.cuda.max_memory_allocated(d) for d in devices]
        out.peak_mem = float(max(peaks))
        out.peak_reserved = float(max(torch.cuda.max_memory_reserved(d) for d in devices))
        used = [process_used_bytes(d.index) for d in devices]
        out.nvml_process = max(used) if all(u is not None for u in used) else None
        out.devices_used = spec.devices_grown(peaks, before)
    out.window = (t0, t1)
    out.starts = timer.starts(t0)
    if e0 is not None and e1 is not None:
        out.energy_j = e1 - e0
    out.losses = [float("nan") if x is None else float(x) for x in steps.losses]
