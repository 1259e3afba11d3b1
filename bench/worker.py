"""Inside one rank: one process group, the group's cells one after another, each isolated.

Started by ``bench.launch`` through torchrun as ``python -m bench.worker PLAN.json`` (a
:class:`bench.spec.GroupPlan`). Each rank measures each cell into a
:class:`bench.spec.RankMeasurement`; rank 0 gathers them and sends them to the launcher as a
``measured`` event, where the row is built. Any rank that fails reports an ``error`` event at once,
so the launcher can tell a failed cell from a hung one.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import tempfile
import time
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

import strategies
from bench import backends, spec
from bench.samplers.nvml import EnergyMeter
from bench.spec import CellSpec, GroupPlan, RankMeasurement
from bench.timing import StepTimer
from bench.workloads import resolve
from strategies.base import Context


class Events:
    """Append-only JSON lines, flushed per line so the launcher sees progress as it happens."""

    def __init__(self, path: Path):
        self.f = open(path, "a", buffering=1)

    def emit(self, event: spec.Event) -> None:
        self.f.write(spec.dump(event) + "\n")
        self.f.flush()


def one_line(e: BaseException) -> str:
    msg = " ".join(str(e).split())
    return f"{type(e).__name__}: {msg}"[:500]


def rank_devices(cell: CellSpec, local_rank: int) -> tuple[torch.device, ...]:
    """The devices this rank drives in ``cell``, from the planned device ids: all of them for a
    one-process cell, the rank's own otherwise."""
    if cell.device != "cuda":
        return (torch.device("cpu"),)
    if cell.n_procs == 1:
        return tuple(torch.device("cuda", i) for i in cell.devices)
    return (torch.device("cuda", cell.devices[local_rank]),)


def profile_steps(step, batches, cell: CellSpec, device: torch.device, trace_path: Path | None):
    """Run ``profile_steps`` more steps under torch.profiler; returns (breakdown, comm rows)."""
    from torch.profiler import ProfilerActivity, profile, record_function

    from bench.comm import analyze_trace

    m = cell.measure
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    dist.barrier()
    with profile(activities=acts, record_shapes=True) as prof:
        for k in range(m.profile_steps):
            with record_function("parbench_step"):
                step.run(batches[m.warmup + k % m.steps])
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    keep = trace_path is not None
    path = trace_path or Path(tempfile.mkstemp(suffix=".json", prefix="parbench-trace-")[1])
    try:
        prof.export_chrome_trace(str(path))
        trace = json.loads(path.read_text())
    finally:
        if not keep:
            path.unlink(missing_ok=True)
    return analyze_trace(trace, device.type, m.profile_steps, backends.get(cell.backend))


def run_cell(cell: CellSpec, plan: GroupPlan, local_rank: int) -> RankMeasurement:
    """Build, warm up, time, profile; returns this rank's measurements (never raises)."""
    rank = dist.get_rank()
    out = RankMeasurement(rank=rank)
    step = None
    m = cell.measure
    try:
        devices = rank_devices(cell, local_rank)
        device = devices[0]
        wl = resolve(cell.workload.spec, seed=m.seed, global_batch=cell.workload.global_batch, **cell.workload.dims)
        strat = strategies.get(cell.strategy_spec)
        ctx = Context(rank=rank, world_size=dist.get_world_size(), local_rank=local_rank, device=device,
                      devices=devices, backend=cell.backend, seed=m.seed, precision=m.precision, lr=m.lr,
                      options=dict(cell.options))
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
            out.gpu_name = torch.cuda.get_device_name(device)
        # Every strategy gets the same global batches, staged on the device before timing starts.
        batches = [ctx.to_device(wl.batch(s)) for s in range(m.warmup + m.steps)]
        step = strat.prepare(wl, ctx)
        out.loss_weight = step.loss_weight
        losses = [step.run(batches[s]) for s in range(m.warmup)]
        meter = EnergyMeter([d.index for d in devices]) if device.type == "cuda" else None
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        e0, t0 = (meter.read() if meter else None), time.time()
        timer = StepTimer(device, barrier=True)
        for s in range(m.warmup, m.warmup + m.steps):
            losses.append(timer.time(lambda: step.run(batches[s])))  # noqa: B023 - called at once
        out.times = timer.times()  # synchronises the device
        t1, e1 = time.time(), (meter.read() if meter else None)
        out.window = (t0, t1)
        out.starts = timer.starts(t0)
        if e0 is not None and e1 is not None:
            out.energy_j = e1 - e0
        out.losses = [float("nan") if x is None else float(x) for x in losses]
        if m.profile_steps > 0:
            tp = time.perf_counter()
            trace = (Path(plan.trace_dir) / f"cell{cell.cell_id}-rank{rank}.json" if plan.trace_dir else None)
            out.breakdown, out.comm = profile_steps(step, batches, cell, device, trace)
            out.profile_s = time.perf_counter() - tp
        if step.finish is not None:
            out.metrics.update(step.finish())
        if step.self_parity is not None:
            out.self_parity = step.self_parity()
        if device.type == "cuda":
            out.peak_mem = float(max(torch.cuda.max_memory_allocated(d) for d in devices))
    except Exception as e:  # noqa: BLE001 - a failing cell is a row, not a crash
        out.status, out.reason = "failed", one_line(e)
        if os.environ.get("PARBENCH_DEBUG"):
            traceback.print_exc()
    finally:
        step = None  # drop the model before the next cell is built
        gc.collect()
        if torch.cuda.is_available() and cell.device == "cuda":
            torch.cuda.empty_cache()
    return out


def warm_group(device: torch.device, precision: str, extra_gpus: tuple[int, ...] = ()) -> None:
    """Pay the once-per-process costs before the first cell, so no cell carries them: the
    communicator (NCCL creates it at the first collective), the CUDA context and the cuBLAS
    handles, in fp32 and in the precision the cells use, on every GPU a one-process cell drives."""
    x = torch.ones(64, 64, device=device)
    dist.all_reduce(x)
    dist.broadcast(x, 0)
    y = x @ x
    if precision == "bf16" and device.type == "cuda":
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = (y @ y).float()
    for i in extra_gpus:
        z = torch.ones(64, 64, device=f"cuda:{i}")
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=precision == "bf16"):
            (z @ z).float().sum().item()
    dist.all_gather_object([None] * dist.get_world_size(), float(y.sum()))
    dist.barrier()


def main(argv: list[str] | None = None) -> int:
    plan: GroupPlan = spec.load(GroupPlan, Path((argv or sys.argv[1:])[0]).read_text())
    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    backend = backends.get(plan.backend)
    if plan.device == "cuda":
        device = torch.device("cuda", plan.cells[0].devices[local_rank] if plan.n_procs > 1 else plan.cells[0].devices[0])
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = False  # fp32 cells are fp32, for parity
        torch.backends.cudnn.allow_tf32 = False
    else:
        device = torch.device("cpu")
    kw: dict[str, Any] = {"timeout": timedelta(seconds=plan.pg_timeout_s)}
    if backend.bind_device:
        kw["device_id"] = device
    dist.init_process_group(backend.name, **kw)
    events = Events(Path(plan.events_prefix + f"-r{rank}.jsonl"))
    extra = sorted({i for c in plan.cells for i in c.devices if c.n_procs == 1} - {device.index}) \
        if device.type == "cuda" and plan.n_procs == 1 else []
    precisions = {c.measure.precision for c in plan.cells}
    warm_group(device, "bf16" if "bf16" in precisions else "fp32", tuple(extra))
    try:
        for cell in plan.cells:
            if rank == 0:
                events.emit(spec.Start(cell_id=cell.cell_id, t=time.time()))
            t0 = time.perf_counter()
            mine = run_cell(cell, plan, local_rank)
            if mine.status != "ok":
                events.emit(spec.Error(cell_id=cell.cell_id, rank=rank, reason=mine.reason, t=time.time()))
            per_rank: list[Any] = [None] * dist.get_world_size()
            dist.all_gather_object(per_rank, mine)
            if rank == 0:
                events.emit(spec.Measured(cell_id=cell.cell_id, wall_s=time.perf_counter() - t0,
                                          ranks=per_rank, t=time.time()))
    finally:
        # Without this, gloo can abort at interpreter exit: its run-loop thread frees work during
        # finalisation (seen in 2-11 of 20 runs on CPU; 0 of 20 with the explicit destroy).
        dist.destroy_process_group()
        gc.collect()
    return 0


if __name__ == "__main__":
    sys.exit(main())
