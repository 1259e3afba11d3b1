"""Inside one rank: one process group, the group's cells one after another, each isolated.

Started by ``bench.launch`` through torchrun as ``python -m bench.worker PLAN.json``. Rank 0 reports
each cell's start and its finished row as JSON lines; any rank that raises reports its error, so
the launcher can tell a failed cell from a hung one.
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
from bench.hardware import peak_flops
from bench.samplers.nvml import EnergyMeter
from bench.timing import StepTimer, summarize
from bench.workloads import resolve
from strategies.base import Context

ENERGY_MIN_WINDOW_S = 1.0


class Events:
    """Append-only JSON lines, flushed per line so the launcher sees progress as it happens."""

    def __init__(self, path: Path):
        self.f = open(path, "a", buffering=1)

    def emit(self, kind: str, **data: Any) -> None:
        self.f.write(json.dumps({"event": kind, "t": time.time(), **data}, default=str) + "\n")
        self.f.flush()


def one_line(e: BaseException) -> str:
    msg = " ".join(str(e).split())
    return f"{type(e).__name__}: {msg}"[:500]


def cell_gpus(cell: dict[str, Any], device: torch.device) -> list[int]:
    """CUDA indices this rank drives: all of the cell's GPUs for one-process strategies."""
    if device.type != "cuda":
        return []
    return list(range(cell["world_size"])) if cell["nproc"] == 1 else [device.index]


def profile_steps(step, batches, plan: dict[str, Any], device: torch.device, trace_path: Path | None):
    """Run ``profile_steps`` more steps under torch.profiler; returns (breakdown, comm rows)."""
    from torch.profiler import ProfilerActivity, profile, record_function

    from bench.comm import analyze_trace

    n = plan["profile_steps"]
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    dist.barrier()
    with profile(activities=acts, record_shapes=True) as prof:
        for k in range(n):
            with record_function("parbench_step"):
                step.run(batches[plan["warmup"] + k % plan["steps"]])
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
    return analyze_trace(trace, device.type, n, plan["backend"])


def run_cell(cell: dict[str, Any], plan: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """Build, warm up, time, profile; returns this rank's measurements (never raises)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    out: dict[str, Any] = {"status": "ok", "reason": "", "times": [], "losses": [], "loss_weight": 0.0,
                           "peak_mem": None, "extra": {}, "energy_j": None, "breakdown": {}, "comm": [],
                           "window": None, "starts": [], "profile_s": 0.0}
    step = None
    try:
        wl = resolve(cell["workload_spec"], seed=plan["seed"], global_batch=plan.get("global_batch"),
                     **cell.get("dims", {}))
        strat = strategies.get(cell["strategy_spec"])
        ctx = Context(rank=rank, world_size=world, local_rank=int(os.environ.get("LOCAL_RANK", 0)),
                      device=device, backend=plan["backend"], seed=plan["seed"], precision=plan["precision"],
                      lr=plan["lr"], options={**plan.get("options", {}), "world_size": cell["world_size"]})
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        n_warm, n_steps = plan["warmup"], plan["steps"]
        # Every strategy gets the same global batches, staged on the device before timing starts.
        batches = [ctx.to_device(wl.batch(s)) for s in range(n_warm + n_steps)]
        step = strat.prepare(wl, ctx)
        out["loss_weight"] = step.loss_weight
        losses = [step.run(batches[s]) for s in range(n_warm)]
        meter = EnergyMeter(cell_gpus(cell, device)) if device.type == "cuda" else None
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        e0, t0 = (meter.read() if meter else None), time.time()
        timer = StepTimer(device, barrier=True)
        for s in range(n_warm, n_warm + n_steps):
            losses.append(timer.time(lambda: step.run(batches[s])))  # noqa: B023 - called at once
        out["times"] = timer.times()  # synchronises the device
        t1, e1 = time.time(), (meter.read() if meter else None)
        out["window"] = (t0, t1)
        out["starts"] = timer.starts(t0)
        if e0 is not None and e1 is not None:
            out["energy_j"] = e1 - e0
        out["losses"] = [float("nan") if x is None else float(x) for x in losses]
        if plan.get("profile_steps", 0) > 0:
            tp = time.perf_counter()
            trace = (Path(plan["trace_dir"]) / f"cell{cell['cell_id']}-rank{rank}.json"
                     if plan.get("trace_dir") else None)
            out["breakdown"], out["comm"] = profile_steps(step, batches, plan, device, trace)
            out["profile_s"] = time.perf_counter() - tp
        if step.finish is not None:
            out["extra"].update(step.finish())
        out["extra"].update(step.extra)
        if device.type == "cuda":
            out["peak_mem"] = float(torch.cuda.max_memory_allocated(device))
    except Exception as e:  # noqa: BLE001 - a failing cell is a row, not a crash
        out.update(status="failed", reason=one_line(e))
        if os.environ.get("PARBENCH_DEBUG"):
            traceback.print_exc()
    finally:
        step = None  # drop the model before the next cell is built
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return out


def row_from(cell: dict[str, Any], plan: dict[str, Any], per_rank: list[dict[str, Any]],
             wall: float, device: torch.device) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Rank 0: merge every rank's measurements into the cell row and its step rows."""
    failed = [r for r in per_rank if r["status"] != "ok"]
    row: dict[str, Any] = {k: cell[k] for k in ("cell_id", "workload", "strategy", "backend", "device",
                                                "world_size", "nproc", "role")}
    row.update(steps=plan["steps"], warmup=plan["warmup"], precision=plan["precision"])
    if failed:
        row.update(status="failed", reason=failed[0]["reason"], cell_wall_s=wall)
        return row, [], {}
    n_warm = plan["warmup"]
    timed = torch.tensor([r["times"] for r in per_rank], dtype=torch.float64)  # ranks x steps
    per_step = timed.max(dim=0).values.numpy()
    stats = summarize(per_step)
    wl = resolve(cell["workload_spec"], seed=plan["seed"], global_batch=plan.get("global_batch"),
                 **cell.get("dims", {}))
    tput = wl.global_batch / stats["step_time_median_s"]
    gpu_name = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    peak = peak_flops(gpu_name, plan["precision"]) if gpu_name else None
    mfu = (wl.flops_per_sample * tput / (peak * cell["world_size"])) if (peak and wl.flops_per_sample) else None
    final = sum(r["losses"][-1] * r["loss_weight"] for r in per_rank if r["loss_weight"])
    mems = [r["peak_mem"] for r in per_rank if r["peak_mem"] is not None]
    extra: dict[str, Any] = {}
    for r in per_rank:  # strategies report per-rank extras; numeric ones are maxed over ranks
        for k, v in r["extra"].items():
            extra[k] = max(extra[k], v) if isinstance(v, (int, float)) and k in extra else extra.get(k, v)
    energies = [r["energy_j"] for r in per_rank]
    t_start, t_end = per_rank[0]["window"]
    # NVML's energy counter advances in steps (about 12.6 J at a time was seen on H200s), so a
    # short window reads 0 or one step: no energy figure below ENERGY_MIN_WINDOW_S.
    if device.type == "cuda" and all(e is not None for e in energies) and t_end - t_start >= ENERGY_MIN_WINDOW_S:
        energy = float(sum(energies))
        extra.update(energy_j=energy, energy_per_sample_j=energy / (plan["steps"] * wl.global_batch),
                     samples_per_j=plan["steps"] * wl.global_batch / energy if energy > 0 else None)
    bds = [r["breakdown"] for r in per_rank if r["breakdown"]]
    for key in ("compute_time_s", "comm_time_s", "exposed_comm_s", "overlap_frac", "idle_frac"):
        vals = [b[key] for b in bds if b.get(key) is not None and b[key] == b[key]]
        if vals:  # mean over ranks, per step
            extra[key] = sum(vals) / len(vals)
    extra["timed_start_unix"], extra["timed_end_unix"] = t_start, t_end
    profile_s = max(r["profile_s"] for r in per_rank)
    if "stage_busy_s" in extra:  # pipelines: idle fraction of the busiest rank
        extra["bubble_measured"] = max(0.0, 1.0 - extra["stage_busy_s"] / stats["step_time_median_s"])
    row.update(status="ok", reason="", global_batch=wl.global_batch, **stats, throughput_samples_s=tput,
               mfu=mfu, peak_mem_bytes=max(mems) if mems else None, loss_final=final, params=wl.params,
               flops_per_sample=wl.flops_per_sample, gpu_name=gpu_name, cell_wall_s=wall,
               overhead_s=wall - float(per_step.sum()) - profile_s, profile_s=profile_s, **extra)
    steps = []
    for rank, r in enumerate(per_rank):
        for s, loss in enumerate(r["losses"]):
            timed_i = s - n_warm
            steps.append(dict(rank=rank, step=s, phase="warmup" if timed_i < 0 else "timed",
                              step_time_s=r["times"][timed_i] if timed_i >= 0 else None,
                              t_unix=r["starts"][timed_i] if timed_i >= 0 else None,
                              loss=loss if r["loss_weight"] else None, loss_weight=r["loss_weight"]))
    comm = [{"cell_id": cell["cell_id"], "rank": rank, "backend": plan["backend"], "world_size": cell["world_size"],
             **c} for rank, r in enumerate(per_rank) for c in r["comm"]]
    return row, steps, {"comm": comm} if comm else {}


def warm_group(device: torch.device, precision: str, n_gpus: int = 1) -> None:
    """Pay the once-per-process costs before the first cell, so no cell carries them: the
    communicator (NCCL creates it at the first collective), the CUDA context and the cuBLAS
    handles, in fp32 and in the precision the cells use."""
    x = torch.ones(64, 64, device=device)
    dist.all_reduce(x)
    dist.broadcast(x, 0)
    y = x @ x
    if precision == "bf16" and device.type == "cuda":
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = (y @ y).float()
    for i in range(1, n_gpus):  # one-process strategies (DataParallel, layer split) drive more GPUs
        z = torch.ones(64, 64, device=f"cuda:{i}")
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=precision == "bf16"):
            (z @ z).float().sum().item()
    dist.all_gather_object([None] * dist.get_world_size(), float(y.sum()))
    dist.barrier()


def main(argv: list[str] | None = None) -> int:
    plan_path = Path((argv or sys.argv[1:])[0])
    plan = json.loads(plan_path.read_text())
    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    if plan["device"] == "cuda":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = False  # fp32 cells are fp32, for parity
        torch.backends.cudnn.allow_tf32 = False
    else:
        device = torch.device("cpu")
    kw: dict[str, Any] = {"timeout": timedelta(seconds=plan["pg_timeout_s"])}
    if plan["backend"] == "nccl":
        kw["device_id"] = device
    dist.init_process_group(plan["backend"], **kw)
    events = Events(Path(plan["events_prefix"] + f"-r{rank}.jsonl"))
    one_proc = dist.get_world_size() == 1 and device.type == "cuda"
    warm_group(device, plan["precision"], max(c["world_size"] for c in plan["cells"]) if one_proc else 1)
    try:
        for cell in plan["cells"]:
            if rank == 0:
                events.emit("start", cell_id=cell["cell_id"])
            t0 = time.perf_counter()
            mine = run_cell(cell, plan, device)
            if mine["status"] != "ok":
                events.emit("error", cell_id=cell["cell_id"], reason=mine["reason"])
            per_rank: list[dict[str, Any]] = [None] * dist.get_world_size()  # type: ignore[list-item]
            dist.all_gather_object(per_rank, mine)
            if rank == 0:
                row, steps, tables = row_from(cell, plan, per_rank, time.perf_counter() - t0, device)
                events.emit("done", cell_id=cell["cell_id"], row=row, steps=steps, tables=tables)
    finally:
        # Without this, gloo can abort at interpreter exit (see shared/NOTES-torch.md).
        dist.destroy_process_group()
        gc.collect()
    return 0


if __name__ == "__main__":
    sys.exit(main())
