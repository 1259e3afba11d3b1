"""FSDP2 (``fully_shard``): parameters, gradients and optimizer state sharded over the ranks.

Each block is its own FSDP unit (all-gathered just before it runs), then the root. With
``reshard_after_forward`` the gathered block parameters are freed after forward and gathered again
for backward (less memory, one more all-gather per block); without it they stay until backward.
"""

from __future__ import annotations

from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from bench.metrics import Metric
from bench.spec import CellSpec
from bench.workloads import Workload
from strategies.base import Context, Step, Strategy
from strategies.common import local_share, make_optimizer, param_count, train_step
from strategies.ddp import data_parallel_check

RESHARD = Metric(name="reshard_after_forward", dtype="boolean", kind="label",
                 doc="FSDP2 frees gathered parameters after forward (True) or keeps them for backward")


def shard_model(wl: Workload, model, mesh, *, reshard: bool) -> None:
    """fully_shard every block that has parameters, then the root."""
    for block in wl.blocks(model):
        if param_count(block):
            fully_shard(block, mesh=mesh, reshard_after_forward=reshard)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard)


class FSDP(Strategy):
    name = "fsdp"
    summary = "FSDP2 fully_shard per block, parameters resharded after forward (ZeRO-3)"
    needs = "world size <= devices; global batch divisible by world size"
    reshard = True
    labels = (RESHARD,)

    def check(self, cell: CellSpec, *, gpus: int) -> str | None:
        return data_parallel_check(cell, gpus=gpus)

    def label_values(self, cell: CellSpec) -> dict:
        return {"reshard_after_forward": self.reshard}

    def prepare(self, wl: Workload, ctx: Context) -> Step:
        mesh = init_device_mesh(ctx.device.type, (ctx.world_size,))
        model = wl.build(ctx.device)
        shard_model(wl, model, mesh, reshard=self.reshard)
        opt = make_optimizer(model.parameters(), ctx)
        return Step(run=lambda b: train_step(model, wl, ctx, opt, local_share(b, ctx)),
                    loss_weight=1.0 / ctx.world_size)


class FSDPNoReshard(FSDP):
    name = "fsdp-noreshard"
    summary = "FSDP2 fully_shard per block, parameters kept gathered from forward to backward (ZeRO-2-like)"
    reshard = False
