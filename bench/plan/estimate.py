"""What a run without a budget will take, said before it starts.

The budget's cost model (:mod:`bench.plan.budget`) gives each process group's start-up and each
cell's overhead; a cell's steps are its workload's FLOPs at this machine's rate: on a CPU the rate of
a short matrix-product probe at a rank's threads, on a GPU of known peak a share of that peak. Models
measure their launches too: a step is never put under STEP_FLOOR_S. It is an estimate, printed as
one ("about"), with a warning where it passes WARN_S: a newcomer's `--world-sizes 1,2,4` of a
large model on two cores otherwise starts without a word.
"""

from __future__ import annotations

import time

from bench.core.spec import CellSpec
from bench.measure.hardware import cpu_threads, gpu_names, peak_flops, threads_per_rank
from bench.plan.budget import GROUP_START_S, fixed_cost
from bench.plan.matrix import Planned

#: the shortest step the estimate assumes (launches, Python, the optimizer), by device
STEP_FLOOR_S = {"cpu": 0.005, "cuda": 0.002}
#: the share of a GPU's dense peak a training step reaches in the estimate
GPU_PEAK_SHARE = 0.35
#: an unbudgeted run estimated past this is warned about
WARN_S = 600.0


def cpu_rate(threads: int, seconds: float = 0.15) -> float:
    """FLOP/s of float32 matrix products on this CPU at ``threads`` intra-op threads."""
    import torch

    was = torch.get_num_threads()
    torch.set_num_threads(max(1, threads))
    try:
        a = torch.randn(256, 256)
        n, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            a @ a
            n += 1
        return 2 * 256**3 * n / (time.perf_counter() - start)
    finally:
        torch.set_num_threads(was)


def device_rate(device: str, widest: int) -> float | None:
    """The FLOP/s one rank is assumed to train at: measured on a CPU, from the peak on a GPU (None
    for a GPU not in the peak table)."""

    if device == "cpu":
        return cpu_rate(threads_per_rank(max(widest, 1) if cpu_threads() > 1 else 1))
    names = gpu_names()
    peak = peak_flops(names[0], "bf16") if names else None
    return peak * GPU_PEAK_SHARE if peak else None


def cell_s(cfg, c: CellSpec, rate: float) -> float:
    """One cell's estimated seconds: its overhead, its compilation and every step it takes at ``rate``
    per device."""
    m, w = c.measure, c.workload
    flops = (w.flops_per_sample or 0.0) * w.global_batch / max(c.n_devices, 1)
    step = max(STEP_FLOOR_S[cfg.matrix.device], flops / rate if rate else 0.0)
    steps = m.warmup + m.steps * max(m.repeats, 1) + m.profile_steps
    return fixed_cost(cfg, c) + step * steps


def estimate_s(cfg, cells: list[Planned], rate: float | None) -> tuple[float, int] | None:
    """(the run's estimated seconds, cells estimated past the cell timeout), None without a rate:
    its process groups' start-ups and its cells, each repeat at most the timeout (which counts
    from each repeat's start, and stops it)."""
    if rate is None:
        return None
    run = [p.spec for p in cells if p.reason is None]
    groups = {(c.n_procs, c.nnodes, c.backend) for c in run}
    limit = cfg.measurement.cell_timeout_s
    each = [(cell_s(cfg, c, rate) / max(c.measure.repeats, 1), max(c.measure.repeats, 1)) for c in run]
    return len(groups) * GROUP_START_S[cfg.matrix.device] + sum(n * min(s, limit) for s, n in each), \
        sum(s > limit for s, _ in each)


def estimate_line(cfg, cells: list[Planned], est: tuple[float, int] | None) -> str:
    """The line printed before an unbudgeted run starts, with the warnings: past WARN_S, and cells
    that would run into their timeout."""
    n = sum(p.reason is None for p in cells)
    if est is None:
        return f"parbench run: {n} cells to measure (no estimate: no known peak for this GPU)"
    seconds, late = est
    took = f"{seconds / 60:.0f} min" if seconds >= 90 else f"{seconds:.0f} s"
    line = (f"parbench run: {n} cells to measure, about {took} (an estimate from the workloads' FLOPs at this "
            "machine's rate" + (", compiling included" if any(p.reason is None and p.spec.training.compile == "on"
                                                               for p in cells) else "") + ")")
    if late:
        line += (f"; {late} of them would pass the {cfg.measurement.cell_timeout_s:g} s cell timeout and be cut: "
                 "a smaller model, fewer --steps or a longer --cell-timeout")
    if seconds > WARN_S:
        line += (f"; that is past {WARN_S / 60:.0f} minutes: --budget 10m fits the run into 10 (or narrow "
                 "--workloads, --strategies or --world-sizes)")
    return line
