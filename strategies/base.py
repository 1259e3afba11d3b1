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
    """The optimizer every strategy uses: plain SGD, so that parity compares like with like.

    DTensor and plain parameters go in separate groups: the multi-tensor (foreach) update, the
    default on CUDA, refuses a list that mixes them (tensor parallel leaves norms and embeddings
    as plain tensors)."""
    from torch.distributed.tensor import DTensor

    params = list(params)
    groups = [g for g in ([p for p in params if isinstance(p, DTensor)],
                          [p for p in params if not isinstance(p, DTensor)]) if g]
    return torch.optim.SGD([{"params": g} for g in groups], lr=ctx.lr)


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


def param_count(m: nn.Module) -> int:
    return sum(p.numel() for p in m.parameters())


def partition(costs: list[float], k: int) -> list[tuple[int, int]]:
    """Split ``costs`` into ``k`` contiguous non-empty ranges minimising the largest sum (linear
    partition by dynamic programming; blocks are few, so O(k n^2) is nothing)."""
    n = len(costs)
    if not 1 <= k <= n:
        raise ValueError(f"cannot split {n} blocks into {k} stages")
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + c)
    inf = float("inf")
    best = [[inf] * (n + 1) for _ in range(k + 1)]
    cut = [[0] * (n + 1) for _ in range(k + 1)]
    best[0][0] = 0.0
    for j in range(1, k + 1):
        for i in range(j, n + 1):
            for s in range(j - 1, i):
                v = max(best[j - 1][s], prefix[i] - prefix[s])
                if v < best[j][i]:
                    best[j][i], cut[j][i] = v, s
    bounds, i = [], n
    for j in range(k, 0, -1):
        bounds.append((cut[j][i], i))
        i = cut[j][i]
    return bounds[::-1]


def stage_modules(wl: Workload, model: nn.Module, n_stages: int) -> list[nn.Module]:
    """The model cut into ``n_stages`` contiguous sequences of blocks of balanced parameter count."""
    blocks = wl.blocks(model)
    # Cost: parameters, with a floor so parameter-free blocks still count as work.
    costs = [max(param_count(b), 1) for b in blocks]
    return [nn.Sequential(*blocks[a:b]) for a, b in partition(costs, n_stages)]


def parse_mesh(text: str | None, world: int) -> tuple[int, int]:
    """'2x2' -> (2, 2): (data-parallel degree, model-parallel degree). Default: dp=2."""
    if text is None:
        return (2, world // 2)
    try:
        dp, mp = (int(x) for x in str(text).lower().split("x"))
    except ValueError:
        raise ValueError(f"mesh {text!r} must look like 2x2 (data parallel x model parallel)") from None
    return dp, mp


def mesh_check(cell: Cell, *, needs_blocks: int | None = None) -> str | None:
    """Divisibility checks of a 2D (dp x mp) mesh cell."""
    w = cell.world_size
    try:
        dp, mp = parse_mesh(cell.options.get("mesh"), w)
    except ValueError as e:
        return str(e)
    if w < 4 or dp < 2 or mp < 2:
        return f"a 2D mesh needs both degrees >= 2 (world size >= 4); got world size {w}"
    if dp * mp != w:
        return f"mesh {dp}x{mp} needs world size {dp * mp}, not {w}"
    return None


class P2P:
    """Blocking send/recv of activations and gradients. Gloo moves only CPU tensors point to
    point, so on CUDA with Gloo the tensor goes through host memory (the cost Gloo really has)."""

    def __init__(self, ctx: Context, group: dist.ProcessGroup | None = None):
        self.via_host = ctx.backend == "gloo" and ctx.device.type == "cuda"
        self.device = ctx.device
        self.group = group

    def send(self, t: Tensor, dst: int) -> None:
        dist.send(t.detach().cpu() if self.via_host else t.detach().contiguous(), dst, group=self.group)

    def recv(self, shape: torch.Size, dtype: torch.dtype, src: int) -> Tensor:
        buf = torch.empty(shape, dtype=dtype, device="cpu" if self.via_host else self.device)
        dist.recv(buf, src, group=self.group)
        return buf.to(self.device) if self.via_host else buf

    DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.int32]

    def send_meta(self, t: Tensor, dst: int) -> None:
        """Shape and dtype of what follows, once, so the receiver can allocate."""
        meta = torch.tensor([self.DTYPES.index(t.dtype), t.dim(), *t.shape], dtype=torch.int64)
        head = torch.tensor([meta.numel()], dtype=torch.int64)
        self.send(head.to(self.device), dst)
        self.send(meta.to(self.device), dst)

    def recv_meta(self, src: int) -> tuple[torch.Size, torch.dtype]:
        n = int(self.recv(torch.Size([1]), torch.int64, src))
        meta = self.recv(torch.Size([n]), torch.int64, src).tolist()
        return torch.Size(meta[2:]), self.DTYPES[meta[0]]


def time_region(device: torch.device, fn: Callable[[], object], reps: int = 3) -> float:
    """Median seconds of ``fn`` over ``reps`` calls (device-synchronised)."""
    import statistics
    import time

    out = []
    for _ in range(reps):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        out.append(time.perf_counter() - t0)
    return statistics.median(out)
