"""The strategy seam: what a strategy needs to run, and the step it hands the harness."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
import torch.distributed as dist
from torch import Tensor, nn

from bench.workloads import Batch, Workload


@dataclass(frozen=True, kw_only=True)
class Cell:
    """One point of the matrix, as the planner sees it (no process group yet)."""

    workload: str
    strategy: str
    backend: str  # "nccl", "gloo", or "none" for one-process strategies
    device: str  # "cuda" or "cpu"
    world_size: int  # devices the cell uses
    gpus_available: int = 0
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class Context:
    """What a strategy sees inside a rank."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str
    seed: int
    precision: str  # "fp32" or "bf16"
    lr: float
    options: dict[str, Any] = field(default_factory=dict)

    def autocast(self):
        """bf16 autocast on CUDA when asked; a no-op otherwise."""
        if self.precision == "bf16":
            return torch.autocast(self.device.type, dtype=torch.bfloat16)
        return nullcontext()

    def to_device(self, batch: Batch) -> Batch:
        return tuple(t.to(self.device, non_blocking=True) for t in batch)  # type: ignore[return-value]


@dataclass(kw_only=True)
class Step:
    """One training step. ``run(global_batch)`` returns this rank's loss tensor, or None on a rank
    that sees no loss. The harness reports the global loss as sum over ranks of
    ``loss * loss_weight`` (1/W for data parallel, 1 on a pipeline's last stage, 0 elsewhere)."""

    run: Callable[[Batch], Tensor | None]
    loss_weight: float
    model: nn.Module | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # columns for the cells table
    finish: Callable[[], dict[str, Any]] | None = None  # called once after the timed steps


class Strategy:
    """Base class: subclasses set the class attributes and implement ``prepare``."""

    name: ClassVar[str]
    summary: ClassVar[str]
    needs: ClassVar[str]
    uses_backend: ClassVar[bool] = True  # False: runs in one process, the backend column is "none"
    min_world: ClassVar[int] = 1

    def procs(self, world_size: int) -> int:
        """Processes the cell needs (DataParallel: 1 process driving world_size GPUs)."""
        return world_size

    def check(self, cell: Cell, wl: Workload) -> str | None:
        """None if the cell can run, else a one-line reason."""
        return common_check(cell, min_world=self.min_world)

    def prepare(self, wl: Workload, ctx: Context) -> Step:
        raise NotImplementedError


def common_check(cell: Cell, *, min_world: int = 1) -> str | None:
    """Checks every multi-process strategy shares: backend vs device, devices vs world size."""
    if cell.world_size < min_world:
        return f"needs world size >= {min_world}, got {cell.world_size}"
    if cell.backend == "nccl" and cell.device != "cuda":
        return "NCCL needs CUDA GPUs; use --backends gloo on CPU"
    if cell.device == "cuda" and cell.world_size > cell.gpus_available:
        return f"world size {cell.world_size} > {cell.gpus_available} visible GPU(s)"
    return None


def make_optimizer(params, ctx: Context) -> torch.optim.Optimizer:
    """The optimizer every strategy uses: plain SGD, so that parity compares like with like."""
    return torch.optim.SGD(params, lr=ctx.lr)


def local_share(batch: Batch, ctx: Context, *, rank: int | None = None, world: int | None = None) -> Batch:
    """This rank's contiguous share of the global batch, moved to its device."""
    from bench.workloads import shard

    return ctx.to_device(shard(batch, ctx.rank if rank is None else rank,
                               ctx.world_size if world is None else world))


def train_step(model: nn.Module, wl: Workload, ctx: Context, opt: torch.optim.Optimizer,
               batch: Batch, after_backward: Callable[[], None] | None = None) -> Tensor:
    """forward, loss, backward, optional gradient hook, optimizer step."""
    x, y = batch
    with ctx.autocast():
        out = model(x)
    loss = wl.loss(out, y)
    loss.backward()
    if after_backward is not None:
        after_backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.detach()


def world_group() -> dist.ProcessGroup | None:
    return dist.group.WORLD if dist.is_initialized() else None
