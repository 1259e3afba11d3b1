"""Helpers several strategies share: batch shares, the train step, stage partitioning,
point-to-point transport, the 2D mesh option, region timing."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from bench.core.mesh import Mesh
from bench.core.spec import CellSpec
from bench.workloads import Batch, Workload, shard
from strategies.base import Context
from strategies.catalog import PLACEMENT_OPTION


def build_for_sharding(wl: Workload, ctx: Context) -> nn.Module:
    """The model a sharding strategy cuts: on the meta device (shapes only) when the workload can
    give a shard its values (``wl.init``), to be placed with :func:`materialize` once cut, so that
    each rank allocates only its part; on the device otherwise, and for a model with tied
    parameters (``to_empty`` would untie them, training another model)."""
    if wl.init is None:
        return wl.build(ctx.device)
    model = wl.build(torch.device("meta"))
    if len({id(p) for _, p in model.named_parameters(remove_duplicate=False)}) < sum(
            1 for _ in model.named_parameters(remove_duplicate=False)):
        return wl.build(ctx.device)
    return model


def materialize(wl: Workload, model: nn.Module, placed: list[tuple[nn.Module, torch.device]]) -> None:
    """Allocate each (part of ``model``, device) in ``placed`` that is still on the meta device and
    give it its values (``wl.init`` over the whole model: names, hence values, are the whole
    model's). Parts a strategy does not place stay on the meta device and take no memory; a model
    built on the device passes through untouched."""
    if wl.init is None:
        return
    for part, device in placed:
        if any(p.device.type == "meta" for p in part.parameters()):
            part.to_empty(device=device)
    wl.init(model)


def local_share(batch: Batch, ctx: Context, *, rank: int | None = None, world: int | None = None) -> Batch:
    """This rank's contiguous share of the global batch, moved to its device."""

    return ctx.to_device(shard(batch, ctx.rank if rank is None else rank,
                               ctx.world_size if world is None else world))


def train_step(model: nn.Module, wl: Workload, ctx: Context, opt: torch.optim.Optimizer,
               batch: Batch, after_backward: Callable[[], None] | None = None, *, autocast: bool = True,
               loss_context: Callable[[], Any] | None = None) -> Tensor:
    """forward (under the precision's autocast unless the strategy casts itself), loss (under
    ``loss_context``, e.g. tensor parallel's loss_parallel), backward, optional gradient hook,
    optimizer step. Returns the loss as a plain tensor."""
    from torch.distributed.tensor import DTensor

    x, y = batch
    with ctx.autocast() if autocast else nullcontext():
        out = model(x)
    with loss_context() if loss_context is not None else nullcontext():
        loss = wl.loss(out, y)
        loss.backward()
    if after_backward is not None:
        after_backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    loss = loss.detach()
    return loss.full_tensor() if isinstance(loss, DTensor) else loss


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


def param_costs(elements: list[int]) -> list[float]:
    """Stage-cut costs of blocks holding ``elements`` parameter elements each, with a floor of one
    so that a parameter-free block still counts as work."""
    return [float(max(e, 1)) for e in elements]


def stage_modules(wl: Workload, model: nn.Module, n_stages: int, costs: list[float] | None = None) -> list[nn.Module]:
    """The model cut into ``n_stages`` contiguous sequences of blocks, balancing ``costs`` (one per
    block; default: parameter count, with a floor so parameter-free blocks still count as work).
    Contiguous cuts put the embedding on the first stage and the head on the last, as torchtitan's
    pipeline split does."""
    blocks = wl.blocks(model)
    if costs is None:
        costs = param_costs([param_count(b) for b in blocks])
    if len(costs) != len(blocks):
        raise ValueError(f"{len(costs)} block costs for {len(blocks)} blocks")
    stages = [nn.Sequential(*blocks[a:b]) for a, b in partition(costs, n_stages)]
    check_untied(model, stages)
    return stages


def check_untied(model: nn.Module, stages: list[nn.Module]) -> None:
    """Refuse a cut that puts one parameter in two stages (tied embedding and head): each stage
    would train its own copy on part of the gradient, silently another model."""
    names = {id(p): n for n, p in model.named_parameters(remove_duplicate=False)}
    where: dict[int, int] = {}
    for k, stage in enumerate(stages):
        for p in stage.parameters():
            if where.setdefault(id(p), k) != k:
                raise ValueError(f"parameter {names.get(id(p), '?')} is shared by stages {where[id(p)]} and {k} "
                                 "(tied weights): cutting the model here would untie it; untie it in the workload "
                                 "or run a data-parallel strategy")


_BLOCK_COSTS: dict[tuple, list[float]] = {}


def block_costs(wl: Workload, model: nn.Module, ctx: Context, batch: Batch) -> list[float]:
    """Forward+backward seconds of each block on one micro-batch ``batch``, measured once per
    (workload, precision, device, micro-batch shape) in this process on global rank 0 and
    broadcast, so every rank cuts the model at the same place (ranks timing for themselves would
    disagree by noise and deadlock the pipeline)."""
    key = (wl.name, ctx.precision, ctx.device.type, tuple(batch[0].shape))
    if key not in _BLOCK_COSTS:
        costs: list[float | None] = [None]
        if dist.get_rank() == 0:
            costs[0] = _time_blocks(wl, model, ctx, batch)
        dist.broadcast_object_list(costs, src=0)
        _BLOCK_COSTS[key] = costs[0]
    return _BLOCK_COSTS[key]


def _time_blocks(wl: Workload, model: nn.Module, ctx: Context, batch: Batch) -> list[float]:
    blocks = wl.blocks(model)
    x, y = ctx.to_device(batch)
    h, out = x, []
    for i, block in enumerate(blocks):
        inp = h.detach().requires_grad_(h.is_floating_point())
        last = i == len(blocks) - 1

        def fb(block=block, inp=inp, last=last):
            with ctx.autocast():
                o = block(inp)
            (wl.loss(o, y) if last else o.float().sum()).backward()
            return o

        fb()  # warm: first calls pay for kernels and allocations
        out.append(max(time_region(ctx.device, fb, reps=3), 1e-7))
        with torch.no_grad(), ctx.autocast():
            h = block(inp)
    model.zero_grad(set_to_none=True)
    return out



def mesh_groups(dp: int, mp: int, placement: str) -> tuple[list[list[int]], list[list[int]]]:
    """(dp groups, mp groups) of global ranks for a dp x mp mesh under ``placement``."""
    if placement == "mp-in-node":
        grid = [[d * mp + m for m in range(mp)] for d in range(dp)]  # row d: an mp group
    else:
        grid = [[m * dp + d for m in range(mp)] for d in range(dp)]  # column m: a dp group
    return [list(col) for col in zip(*grid)], grid


def hybrid_mesh(device_type: str, dp: int, mp: int, placement: str, names: tuple[str, str]):
    """The 2D DeviceMesh (dims ``names``: data parallel, model parallel) laid out as ``placement``
    asks; mp-in-node is exactly ``init_device_mesh``'s row-major layout."""
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

    if placement == "mp-in-node":
        return init_device_mesh(device_type, (dp, mp), mesh_dim_names=names)
    _, grid = mesh_groups(dp, mp, placement)
    return DeviceMesh(device_type, torch.tensor(grid), mesh_dim_names=names)


def _crosses(groups: list[list[int]], per_node: int) -> bool:
    return any(len({r // per_node for r in g}) > 1 for g in groups)


def cell_mesh(options: dict, world: int, model: str) -> Mesh:
    """The 2D mesh of a hybrid cell (data parallel x ``model`` parallel) from its options."""
    return Mesh.grid(options.get("mesh"), world, model)


def placement_check(cell: CellSpec, mp_name: str) -> str | None:
    """On several nodes, the dimension ``placement`` keeps inside a node must fit in one."""
    if cell.nnodes <= 1:
        return None
    mesh = cell_mesh(cell.options, cell.n_devices, mp_name)
    dp, mp = mesh.dp, mesh.mp
    placement = cell.options.get("placement") or PLACEMENT_OPTION.default
    per = cell.n_procs // cell.nnodes
    dps, mps = mesh_groups(dp, mp, placement)
    inside, degree, groups = (mp_name, mp, mps) if placement == "mp-in-node" else ("dp", dp, dps)
    if _crosses(groups, per):
        other = "dp-in-node" if placement == "mp-in-node" else "mp-in-node"
        return (f"placement {placement}: {inside}={degree} ranks cannot share a node of {per} ranks; use a mesh whose "
                f"{inside} degree divides {per}, or option placement={other}")
    return None


def placement_label(cell: CellSpec, mp_name: str) -> str:
    """'tp within nodes, dp across 2 nodes' (or 'one node')."""
    if cell.nnodes <= 1:
        return "one node"
    mesh = cell_mesh(cell.options, cell.n_devices, mp_name)
    dps, mps = mesh_groups(mesh.dp, mesh.mp, cell.options.get("placement") or PLACEMENT_OPTION.default)
    per = cell.n_procs // cell.nnodes

    def where(groups):
        return f"across {cell.nnodes} nodes" if _crosses(groups, per) else "within nodes"

    return f"{mp_name} {where(mps)}, dp {where(dps)}"


def mesh_check(cell: CellSpec) -> str | None:
    """Divisibility checks of a 2D (dp x mp) mesh cell."""
    w = cell.n_devices
    try:
        mesh = cell_mesh(cell.options, w, "mp")
    except ValueError as e:
        return str(e)
    dp, mp = mesh.dp, mesh.mp
    if w < 4 or dp < 2 or mp < 2:
        return f"a 2D mesh needs both degrees >= 2 (world size >= 4); got world size {w}"
    if dp * mp != w:
        return f"mesh {dp}x{mp} needs world size {dp * mp}, not {w}"
    return None


class P2P:
    """Blocking send/recv of activations and gradients. A backend without point-to-point for CUDA
    tensors (Gloo) moves them through host memory: the cost that backend really has."""

    def __init__(self, ctx: Context, group: dist.ProcessGroup | None = None):
        self.via_host = ctx.p2p_via_host
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
