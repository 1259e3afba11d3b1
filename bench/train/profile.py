"""A cell's profiled steps on one rank: the compute/communication breakdown, the communication
records and the per-step communication the distribution check reads as evidence.

Profiled steps run after a cell's first timed repeat (:func:`profile_into`), or, when deferred
(``profile_at`` "end"), in the group's profile pass after every timed step (:func:`profile_cell`).
"""

from __future__ import annotations

import json
import os
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile, record_function, schedule

from bench.core import backends
from bench.core.spec import CellSpec, GroupPlan, RankMeasurement
from bench.measure.trace import analyze_trace, comm_volume
from bench.train.cell import PLACE, build, release
from bench.train.events import one_line


def profile_steps(step, batches, cell: CellSpec, device: torch.device, trace_path: Path | None, *,
                  n: int, gpu: bool, shapes: bool = True) -> dict[str, Any]:
    """Run ``n`` more steps under torch.profiler (GPU activity too when ``gpu``), after one profiled
    step whose events are discarded, with the ops' input shapes when ``shapes``; returns the Chrome
    trace of the ``n`` as a dict (the trace file is removed afterwards unless ``trace_path`` keeps it)."""
    m = cell.measure
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if gpu and device.type == "cuda" else [])
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    dist.barrier()
    # One step under the profiler first, its events discarded (the schedule's warm-up): the
    # profiler's own start (CUPTI's activation, its first buffers) lands there, not on the steps
    # the breakdown describes.
    plan = schedule(wait=0, warmup=1, active=n, repeat=1)
    with profile(activities=acts, record_shapes=shapes, schedule=plan) as prof:
        for k in range(n + 1):
            with record_function("parbench_step"):
                step.run(batches[(m.warmup + k % m.steps) % len(batches)])
            if k == n and device.type == "cuda":
                torch.cuda.synchronize(device)
            prof.step()
    keep = trace_path is not None
    path = trace_path or Path(tempfile.mkstemp(suffix=".json", prefix="parbench-trace-")[1])
    try:
        prof.export_chrome_trace(str(path))
        return json.loads(path.read_text())
    finally:
        if not keep:
            path.unlink(missing_ok=True)


def profile_into(out: RankMeasurement, step, batches, cell: CellSpec, plan: GroupPlan, device: torch.device,
                 backend: backends.Backend, *, n: int, full: bool) -> None:
    """``n`` profiled steps into ``out``: the communication per step (the distribution check's
    evidence) always; with ``full``, GPU activity too, the breakdown and the communication records
    (and the trace kept under the run's traces when asked)."""
    trace_path = Path(plan.trace_dir) / f"cell{cell.cell_id}-rank{out.rank}.json" if plan.trace_dir and full else None
    # Input shapes cost the launching thread time on every op, and a launch-bound step stretches
    # with it (on 4 H100s such profiled steps ran up to 2.8x their timed median); only a host-side
    # backend's byte counts need them, a kernel backend's come with its own records
    # (record_param_comms).
    shapes = device.type != "cuda" or not backend.comm_in_kernels()
    trace = profile_steps(step, batches, cell, device, trace_path, n=n, gpu=full, shapes=shapes)
    if full:
        out.breakdown, out.comm = analyze_trace(trace, device.type, n, backend)
    calls, nbytes = comm_volume(trace, backend)
    out.comm_calls_per_step, out.comm_bytes_per_step = calls / n, nbytes / n


def profile_cell(cell: CellSpec, plan: GroupPlan, local_rank: int, warmup: int) -> RankMeasurement:
    """A cell's deferred profile pass: build it again, run ``warmup`` steps (what its first timed
    repeat needed to settle), then its profiled steps; returns this rank's breakdown, communication
    records and the pass's time (build included) as ``profile_s`` (never raises).

    Why deferred: a profiler session with GPU activity leaves the process slower at launching work
    even with CUPTI torn down (x1.09 on a launch-bound loop, ``tools/baselines/profiler_aftereffect.py``),
    and the harness's ranks go on to time the group's later cells; on 2 H100s a host-bound tensor-sp
    cell timed after the reference cell's GPU-profiled steps moves 16-26% from round to round within a
    call, and holds within 0.2% without them, while its plain loop beside it moves 8-10%
    (docs/RESULTS.md)."""
    out = RankMeasurement(rank=dist.get_rank(), **PLACE)
    step = None
    tp = time.perf_counter()
    try:
        _, device, batches, step, _ = build(cell, local_rank, out)
        for k in range(max(warmup, 1)):
            step.run(batches[k % len(batches)])
        profile_into(out, step, batches, cell, plan, device, backends.get(cell.backend),
                     n=cell.measure.profile_steps, full=True)
    except Exception as e:  # noqa: BLE001 - a failed pass leaves the cell's timing alone
        out.status, out.reason = "failed", one_line(e)
        if os.environ.get("PARBENCH_DEBUG"):
            traceback.print_exc()
    finally:
        step = None
        release(cell)
    out.profile_s = time.perf_counter() - tp
    return out
