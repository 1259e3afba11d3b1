"""DistributedDataParallel: one process a device, gradients all-reduced in overlapped buckets."""

from __future__ import annotations

from torch.nn.parallel import DistributedDataParallel as DDP

from bench.workloads import Workload
from strategies.base import Cell, Context, Step, Strategy, common_check, local_share, make_optimizer, train_step


class DDPStrategy(Strategy):
    name = "ddp"
    summary = "DistributedDataParallel: bucketed all-reduce overlapped with backward"
    needs = "world size <= devices; global batch divisible by world size"

    def check(self, cell: Cell, wl: Workload) -> str | None:
        return data_parallel_check(cell, wl)

    def prepare(self, wl: Workload, ctx: Context) -> Step:
        model = wl.build(ctx.device)
        ids = [ctx.device.index] if ctx.device.type == "cuda" else None
        ddp = DDP(model, device_ids=ids, bucket_cap_mb=ctx.options.get("bucket_mb", 25))
        opt = make_optimizer(ddp.parameters(), ctx)
        return Step(run=lambda b: train_step(ddp, wl, ctx, opt, local_share(b, ctx)),
                    loss_weight=1.0 / ctx.world_size, model=model)


def data_parallel_check(cell: Cell, wl: Workload, *, min_world: int = 1) -> str | None:
    """The checks of every strategy that splits the global batch over all its ranks."""
    return common_check(cell, min_world=min_world) or divisible(wl, cell.world_size)


def divisible(wl: Workload, world: int) -> str | None:
    if wl.global_batch % world:
        return f"global batch {wl.global_batch} does not divide by world size {world}"
    return None
