"""Single device: the reference every other strategy is checked against."""

from __future__ import annotations

from bench.core.spec import CellSpec
from bench.workloads import Workload
from strategies import catalog
from strategies.base import Context, Step, Strategy
from strategies.common import train_step
from strategies.training import make_optimizer, whole_model


class Single(Strategy):
    declared = catalog.SINGLE

    def check(self, cell: CellSpec, *, gpus: int) -> str | None:
        if cell.n_devices != 1:
            return "single device runs at world size 1 only"
        if cell.device == "cuda" and gpus < 1:
            return "no visible GPU"
        return None

    def prepare(self, wl: Workload, ctx: Context) -> Step:
        model = whole_model(wl, wl.build(ctx.device), ctx)
        opt = make_optimizer(model.parameters(), ctx)
        return Step(run=lambda b: train_step(model, wl, ctx, opt, ctx.to_device(b)), loss_weight=1.0, optimizer=opt)
