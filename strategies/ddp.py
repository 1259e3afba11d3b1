"""DistributedDataParallel: one process a device, gradients all-reduced in overlapped buckets."""

from __future__ import annotations

import dataclasses

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from bench.core.memory import Terms
from bench.core.spec import CellSpec
from bench.workloads import Workload
from strategies import catalog
from strategies.base import Context, Step, Strategy, common_check
from strategies.common import local_share, train_step
from strategies.memory import held, layout, shares, zero_partition
from strategies.training import compile_module, make_optimizer, optimizer_class, optimizer_kwargs, prepare_blocks


class DDPStrategy(Strategy):
    """DistributedDataParallel as its documentation configures it: one process per device,
    ``device_ids=[local device]``, buckets of ``bucket_cap_mb`` (DDP's default 25 MiB) all-reduced
    while backward runs. ``gradient_as_bucket_view`` and ``static_graph`` (off by default in DDP) are
    options (https://pytorch.org/docs/stable/generated/torch.nn.parallel.DistributedDataParallel.html)."""

    declared = catalog.DDP

    def check(self, cell: CellSpec, *, gpus: int) -> str | None:
        return data_parallel_check(cell, gpus=gpus)

    def prepare(self, wl: Workload, ctx: Context) -> Step:
        model = wl.build(ctx.device)
        prepare_blocks(wl, model, ctx, compile_each=False)
        ids = [ctx.device.index] if ctx.device.type == "cuda" else None
        ddp = DDP(model, device_ids=ids, bucket_cap_mb=ctx.options["bucket_mb"],
                  gradient_as_bucket_view=ctx.options["ddp_grad_as_bucket_view"],
                  static_graph=ctx.options["ddp_static_graph"])
        opt = self.optimizer(ddp, ctx)
        step_model = compile_module(ddp, ctx)
        return Step(run=lambda b: train_step(step_model, wl, ctx, opt, local_share(b, ctx)),
                    loss_weight=1.0 / ctx.world_size, optimizer=opt)


    def memory_terms(self, cell: CellSpec) -> Terms:
        """A whole replica on every rank, and the reducer's buckets: DDP's Reducer allocates one flat
        tensor per bucket, together as large as every gradient (its buckets partition the
        parameters that require a gradient, ``bucket_cap_mb`` each, the first smaller), and copies
        each gradient into its bucket to all-reduce it. With ``gradient_as_bucket_view`` the
        gradients are views into those buckets, so the buckets are the gradients and add nothing
        (DistributedDataParallel's documentation, ``gradient_as_bucket_view``)."""
        base = super().memory_terms(cell)
        view = cell.options.get("ddp_grad_as_bucket_view", False)
        buckets = 0.0 if view else float(cell.workload.trainable_bytes or 0)
        return dataclasses.replace(base, buffers=buckets,
                                   buffers_note="" if view else "DDP's all-reduce buckets (a copy of the gradients)")

    def optimizer(self, ddp: DDP, ctx: Context) -> torch.optim.Optimizer:
        """The optimizer over the replicated parameters: whole on every rank."""
        return make_optimizer(ddp.parameters(), ctx)


class DDPZero1(DDPStrategy):
    """DDP with ``torch.distributed.optim.ZeroRedundancyOptimizer`` (ZeRO stage 1): gradients are
    all-reduced as under DDP, each rank updates and keeps the optimizer state of its part of the
    parameters only, then the updated parameters are broadcast from their owners
    (https://pytorch.org/tutorials/recipes/zero_redundancy_optimizer.html). With SGD, which keeps no
    state, it only adds the broadcasts."""

    declared = catalog.DDP_ZERO1

    def state_share(self, cell: CellSpec) -> float:
        return 1 / cell.n_devices

    def memory_terms(self, cell: CellSpec) -> Terms:
        """DDP's terms (its buckets included), with the optimizer state of the fullest rank's
        partition: ZeroRedundancyOptimizer gives each parameter, largest first, to the rank with the
        fewest elements so far (``_partition_parameters``) and keeps state for its own only, so
        the fullest rank holds more than 1/n when the parameters do not split evenly. Without the
        planner's layout: 1/n, approximate."""
        base = super().memory_terms(cell)
        ps = layout(cell.workload)
        if ps is None:
            return dataclasses.replace(base, how="approximate")  # the state: an even split assumed
        ranks = [held([ps[i] for i in owned]) for owned in zero_partition(ps, cell.n_devices)]
        return dataclasses.replace(base, state=shares(ranks, ps)[2])

    def optimizer(self, ddp: DDP, ctx: Context) -> torch.optim.Optimizer:
        from torch.distributed.optim import ZeroRedundancyOptimizer

        return ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=optimizer_class(ctx.training.optimizer),
                                       **optimizer_kwargs(ctx))


def data_parallel_check(cell: CellSpec, *, gpus: int, min_world: int = 1) -> str | None:
    """The checks of every strategy that splits the global batch over all its ranks."""
    return common_check(cell, gpus=gpus, min_world=min_world) or divisible(cell.workload.global_batch,
                                                                          cell.n_devices)


def divisible(global_batch: int, world: int) -> str | None:
    if global_batch % world:
        return f"global batch {global_batch} does not divide by world size {world}"
    return None
