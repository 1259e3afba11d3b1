"""One cell on one rank: its devices, its model under its strategy with its batches staged, and the
release of what it left before the next cell is built. Shared by the timed repeats
(:mod:`bench.train.worker`) and the profile pass (:mod:`bench.train.profile`)."""

from __future__ import annotations

import gc
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

import strategies
from bench.core.spec import CellSpec, RankMeasurement
from bench.multinode.netinfo import device_names
from bench.workloads import Workload, resolve
from bench.workloads.base import batch_problem
from strategies.base import Context
from strategies.training import compiled_loss, reset_counts

#: Where this process runs (bench.multinode.netinfo.placement), found once per process group.
PLACE: dict[str, Any] = {}


def rank_devices(cell: CellSpec, local_rank: int) -> tuple[torch.device, ...]:
    """The devices this rank drives in ``cell``, from the planned device ids: all of them for a
    one-process cell, the rank's own otherwise."""
    if cell.device != "cuda":
        return (torch.device("cpu"),)
    if cell.n_procs == 1:
        return tuple(torch.device("cuda", i) for i in cell.devices)
    return (torch.device("cuda", cell.devices[local_rank]),)


def cell_workload(cell: CellSpec) -> Workload:
    """The cell's workload, built from its spec, dimensions and the plan's global batch (which
    stands for a global_batch among the dimensions: the planner resolved the two)."""
    dims = {k: v for k, v in cell.workload.dims.items() if k != "global_batch"}
    wl = resolve(cell.workload.spec, seed=cell.measure.seed, global_batch=cell.workload.global_batch, **dims)
    if wl.global_batch != cell.workload.global_batch:
        raise ValueError(f"workload {cell.workload.name} built a global batch of {wl.global_batch}, the plan asked "
                         f"{cell.workload.global_batch}: its factory must accept global_batch")
    return wl


def build(cell: CellSpec, local_rank: int, out: RankMeasurement):
    """A cell's model under its strategy, and its batches staged on the device: (devices, device,
    batches, step, memory each device held before the cell). Fills ``out``'s device facts."""
    m = cell.measure
    rank = dist.get_rank()
    devices = rank_devices(cell, local_rank)
    device = devices[0]
    if device.type == "cuda":
        out.device_ids = device_names([d.index for d in devices])
    wl = cell_workload(cell)
    strat = strategies.get(cell.strategy_spec)
    ctx = Context(rank=rank, world_size=dist.get_world_size(), local_rank=local_rank, device=device,
                  devices=devices, backend=cell.backend, seed=m.seed, precision=m.precision, training=cell.training,
                  options=dict(cell.options))
    before: list[int] = []
    if device.type == "cuda":
        out.gpu_name = torch.cuda.get_device_name(device)
        # What every device held before this cell (the group's warm-up tensors, caches): a
        # device counts as used only if the cell's training grew it.
        before = [torch.cuda.memory_allocated(d) for d in devices]
    # Every strategy gets the same global batches, staged on the device before timing starts.
    batches = []
    for s in range(m.staged_batches()):
        b = wl.batch(s)
        problem = batch_problem(wl, b, s)
        if problem:
            raise ValueError(f"workload {cell.workload.name}: {problem}")
        batches.append(ctx.to_device(b))
    if cell.training.compile == "on":
        # Each compiled cell starts from an empty dynamo cache: the blocks of the cells before it
        # share its code objects, and past dynamo's recompile limit a frame silently runs eager.
        # Inductor's on-disk cache still spares recompiling a graph seen before.
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()
    reset_counts()
    step = strat.prepare(compiled_loss(wl, ctx), ctx)
    count_held(step.optimizer, out)
    return devices, device, batches, step, before


def release(cell: CellSpec) -> None:
    """Free what a cell left (its model is already dropped) before the next one is built."""
    gc.collect()
    if torch.cuda.is_available() and cell.device == "cuda":
        torch.cuda.empty_cache()


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def _bytes(tensors) -> float:
    """Bytes of the distinct storages of ``tensors`` (a DTensor counts its local shard)."""
    seen, n = set(), 0
    for t in tensors:
        local = _local(t)
        key = (local.device, local.untyped_storage().data_ptr())
        if key not in seen:
            seen.add(key)
            n += local.untyped_storage().nbytes()
    return float(n)


def count_held(opt: torch.optim.Optimizer | None, out: RankMeasurement) -> None:
    """Count into ``out`` the bytes this rank's optimizer holds: its parameters now, their
    gradients when its first step starts (every gradient exists then) and its state when that step
    ends (a sharded optimizer's own partition: ZeroRedundancyOptimizer keeps it in ``optim``)."""
    if opt is None:
        return
    params = [p for g in opt.param_groups for p in g["params"]]
    out.held_params = _bytes(params)
    hooks = []

    def grads(*_):
        out.held_grads = _bytes([p.grad for p in params if p.grad is not None])
        hooks.pop(0).remove()

    def state(*_):
        inner = getattr(opt, "optim", opt)
        out.held_state = _bytes([v for st in inner.state.values() for v in st.values()
                                 if isinstance(v, torch.Tensor) and v.dim() > 0])
        hooks.pop(0).remove()

    hooks.append(opt.register_step_pre_hook(grads))
    hooks.append(opt.register_step_post_hook(state))


def local_numel(opt: torch.optim.Optimizer | None) -> int | None:
    """Parameter elements this rank holds, from its optimizer (a DTensor counts its local shard)."""
    if opt is None:
        return None
    seen, n = set(), 0
    for g in opt.param_groups:
        for p in g["params"]:
            if id(p) not in seen:
                seen.add(id(p))
                n += (p.to_local() if isinstance(p, DTensor) else p).numel()
    return n
