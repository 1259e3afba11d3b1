"""torch.nn.DataParallel: one process scatters each batch over several GPUs."""

from __future__ import annotations

import torch
from torch import nn

from bench.workloads import Workload
from strategies.base import Cell, Context, Step, Strategy, make_optimizer, train_step


class DataParallel(Strategy):
    name = "dataparallel"
    summary = "nn.DataParallel: one process, module replicated on each GPU every step"
    needs = "CUDA; world size <= visible GPUs; runs in one process (backend 'none')"
    uses_backend = False

    def procs(self, world_size: int) -> int:
        return 1

    def check(self, cell: Cell, wl: Workload) -> str | None:
        # On CPU nn.DataParallel silently runs the plain module: that would be a single-device
        # number under a data-parallel name.
        if cell.device != "cuda":
            return "nn.DataParallel needs CUDA GPUs (on CPU it silently runs one replica)"
        if cell.world_size > cell.gpus_available:
            return f"world size {cell.world_size} > {cell.gpus_available} visible GPU(s)"
        if wl.global_batch % cell.world_size:
            return f"global batch {wl.global_batch} does not divide by {cell.world_size} GPUs"
        return None

    def prepare(self, wl: Workload, ctx: Context) -> Step:
        n = ctx.options["world_size"]
        model = wl.build(ctx.device)
        dp = nn.DataParallel(model, device_ids=list(range(n)), output_device=ctx.device.index)
        opt = make_optimizer(model.parameters(), ctx)

        def run(batch):
            return train_step(dp, wl, ctx, opt, ctx.to_device(batch))

        assert torch.cuda.device_count() >= n
        return Step(run=run, loss_weight=1.0, model=model)
