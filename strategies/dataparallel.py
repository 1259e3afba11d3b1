"""torch.nn.DataParallel: one process scatters each batch over several GPUs."""

from __future__ import annotations

from torch import nn

from bench.core.spec import CellSpec
from bench.workloads import Workload
from strategies.base import Context, OneProcessMultiGPU, Step
from strategies.common import train_step
from strategies.training import make_optimizer


class DataParallel(OneProcessMultiGPU):
    name = "dataparallel"
    summary = "nn.DataParallel: one process, module replicated on each GPU every step"
    needs = "CUDA; world size <= visible GPUs; runs in one process"
    # On CPU nn.DataParallel silently runs the plain module: that would be a single-device number
    # under a data-parallel name.
    cpu_reason = "nn.DataParallel needs CUDA GPUs (on CPU it silently runs one replica)"
    # Its replicas are shallow copies made every forward: a block's checkpointed or compiled forward
    # would stay bound to the original module on the first GPU.
    compiles = ""
    no_compile = "nn.DataParallel replicates the module every forward; torch.compile does not follow the replicas"
    no_ac = "nn.DataParallel's per-forward replicas would call the original block's forward"

    def check(self, cell: CellSpec, *, gpus: int) -> str | None:
        reason = super().check(cell, gpus=gpus)
        if reason is None and cell.workload.global_batch % cell.n_devices:
            reason = f"global batch {cell.workload.global_batch} does not divide by {cell.n_devices} GPUs"
        return reason

    def prepare(self, wl: Workload, ctx: Context) -> Step:
        model = wl.build(ctx.device)
        dp = nn.DataParallel(model, device_ids=[d.index for d in ctx.devices], output_device=ctx.device.index)
        opt = make_optimizer(model.parameters(), ctx)
        return Step(run=lambda b: train_step(dp, wl, ctx, opt, ctx.to_device(b)), loss_weight=1.0, optimizer=opt)
