"""Hand-written data parallelism: backward, then all-reduce the gradients ourselves.

Two flavours: one all-reduce per parameter (many small messages, the cost DDP's buckets avoid),
and gradients packed into flat buffers of ``bucket_mb`` before reducing. Neither overlaps
communication with backward, which is the point of comparing them with DDP.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from bench.core.memory import Terms
from bench.core.spec import CellSpec
from bench.workloads import Workload
from strategies import catalog
from strategies.base import Context, Step, Strategy
from strategies.catalog import BUCKET_MB
from strategies.common import local_share, train_step
from strategies.ddp import data_parallel_check
from strategies.memory import largest_bucket, layout
from strategies.training import make_optimizer, whole_model


def buckets(tensors: list[torch.Tensor], cap_bytes: int) -> list[list[torch.Tensor]]:
    """Greedy split into consecutive groups of at most ``cap_bytes`` (a tensor larger than the cap
    gets a bucket of its own), each group of one dtype."""
    out: list[list[torch.Tensor]] = []
    size = 0
    for t in tensors:
        nbytes = t.numel() * t.element_size()
        if not out or size + nbytes > cap_bytes or out[-1][0].dtype != t.dtype:
            out.append([])
            size = 0
        out[-1].append(t)
        size += nbytes
    return out


def allreduce_mean_bucketed(grads: list[torch.Tensor], cap_bytes: int, *, world: int,
                            group: dist.ProcessGroup | None = None) -> None:
    """Average ``grads`` over ``group`` in place: flattened into buffers of at most ``cap_bytes``,
    one all-reduce per buffer."""
    for bucket in buckets(grads, cap_bytes):
        flat = _flatten_dense_tensors(bucket)
        dist.all_reduce(flat, group=group)
        flat.div_(world)
        for g, new in zip(bucket, _unflatten_dense_tensors(flat, bucket)):
            g.copy_(new)


class AllReduce(Strategy):
    declared = catalog.ALLREDUCE
    bucketed = False

    def check(self, cell: CellSpec, *, gpus: int) -> str | None:
        return data_parallel_check(cell, gpus=gpus)

    def prepare(self, wl: Workload, ctx: Context) -> Step:
        model = whole_model(wl, wl.build(ctx.device), ctx)
        params = [p for p in model.parameters() if p.requires_grad]
        opt = make_optimizer(params, ctx)
        w = ctx.world_size
        cap = int(ctx.options.get("bucket_mb", BUCKET_MB.default) * 2**20)

        def per_param():
            for p in params:
                dist.all_reduce(p.grad)
                p.grad.div_(w)

        def bucketed():
            allreduce_mean_bucketed([p.grad for p in params], cap, world=w)

        hook = bucketed if self.bucketed else per_param
        return Step(run=lambda b: train_step(model, wl, ctx, opt, local_share(b, ctx), after_backward=hook),
                    loss_weight=1.0 / w, optimizer=opt)


class AllReduceBucketed(AllReduce):
    declared = catalog.ALLREDUCE_BUCKETED
    bucketed = True

    def memory_terms(self, cell: CellSpec) -> Terms:
        """A whole replica on every rank (the per-parameter flavour reduces each gradient in place
        and adds nothing), and here one flat buffer at a time: ``_flatten_dense_tensors`` copies a
        bucket of consecutive gradients (at most ``bucket_mb``) into a new tensor, reduced, then
        copied back (its unflattened pieces are views of it), so the largest bucket is the buffer.
        Without the planner's layout: the smaller of the cap and every gradient, approximate."""
        base = super().memory_terms(cell)
        cap = int(cell.options.get("bucket_mb", BUCKET_MB.default) * 2**20)
        ps = layout(cell.workload)
        if ps is None:
            return dataclasses.replace(base, buffers=float(min(cap, cell.workload.trainable_bytes or 0)),
                                       buffers_note="flat all-reduce bucket", how="approximate")
        biggest = largest_bucket([p.nbytes for p in ps if p.trainable], cap)
        return dataclasses.replace(base, buffers=float(biggest), buffers_note="flat all-reduce bucket")
