"""torch.nn.DataParallel: one process scatters each batch over several GPUs."""

from __future__ import annotations

from torch import nn

from bench.core.spec import CellSpec
from bench.workloads import Workload
from strategies import catalog
from strategies.base import Context, OneProcessMultiGPU, Step
from strategies.common import train_step
from strategies.training import make_optimizer


class DataParallel(OneProcessMultiGPU):
    declared = catalog.DATA_PARALLEL
    # On CPU nn.DataParallel silently runs the plain module: that would be a single-device number
    # under a data-parallel name.
    cpu_reason = "nn.DataParallel needs CUDA GPUs (on CPU it silently runs one replica)"

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
