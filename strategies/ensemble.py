"""Collaborating models: an ensemble of independent models, one per rank.

Rank r trains its own copy of the workload's architecture, re-initialised from its own seed, on its own
share of each global batch; nothing is exchanged while training. After the timed steps every
member predicts on the same held-out batch (one rank's share of a global batch no step trains on)
and the predictions are combined with ``all_gather``
(mean of the members' outputs). The cell reports the aggregation's time and bytes and the
ensemble's loss, and rank 0 checks the whole thing against the same members trained one after
another in a single process (its ``self_parity``, which fills the parity columns).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from bench.core.spec import CellSpec
from bench.workloads import Workload
from strategies import catalog
from strategies.base import Context, Step, Strategy
from strategies.common import local_share, time_region, train_step
from strategies.ddp import data_parallel_check
from strategies.training import make_optimizer, whole_model

#: Above this many gathered bytes the aggregation is timed twice instead of five times (after one
#: untimed gather in either case)
AGGREGATE_BIG_BYTES = 256 * 2**20


def build_member(wl: Workload, device: torch.device, seed: int) -> torch.nn.Module:
    """The workload's architecture with every layer re-initialised (its default init) from ``seed``."""
    model = wl.build(device)
    torch.manual_seed(seed)
    for m in model.modules():
        if hasattr(m, "reset_parameters"):
            m.reset_parameters()
    return model


class Ensemble(Strategy):
    declared = catalog.ENSEMBLE

    def check(self, cell: CellSpec, *, gpus: int) -> str | None:
        return data_parallel_check(cell, gpus=gpus, min_world=self.min_world)

    def prepare(self, wl: Workload, ctx: Context) -> Step:
        r, w = ctx.rank, ctx.world_size
        model = whole_model(wl, build_member(wl, ctx.device, ctx.seed + 1000 * (r + 1)), ctx)
        opt = make_optimizer(model.parameters(), ctx)
        seen: list = []
        # No training step uses this index. Every member predicts on the same rows: the first rank's
        # share of that batch, not all of it (a gpt-200m global batch of 64 is 4.3 GB of fp32 logits
        # a member; on Gloo x2 gathering it five times would take most of a 21 s cell).
        held_out = local_share(wl.batch(10**6), ctx, rank=0)
        result: dict[str, float] = {}

        def run(b):
            seen.append(b)
            return train_step(model, wl, ctx, opt, local_share(b, ctx))

        def predict(m, x):
            with torch.no_grad(), ctx.autocast():
                return m(x).float()

        def finish():
            x, y = held_out
            out = predict(model, x)
            gathered = [torch.empty_like(out) for _ in range(w)]

            def aggregate():
                dist.all_gather(gathered, out)

            # Five timed gathers of a small output; two of a large one (the decision rests on the
            # output's size, the same on every rank, so every rank runs the same collectives).
            nbytes = out.numel() * out.element_size() * w
            aggregate()  # untimed: the first gather of this size pays its buffers' first use
            agg_s = time_region(ctx.device, aggregate, reps=2 if nbytes > AGGREGATE_BIG_BYTES else 5)
            result["loss"] = float(wl.loss(torch.stack(gathered).mean(0), y))
            return {"aggregate_s": agg_s, "aggregate_bytes": float(nbytes),
                    "ensemble_loss": result["loss"]}

        def self_parity():
            if r != 0:
                return None
            x, y = held_out
            outs = []  # the same members, trained one after another in this process
            for k in range(w):
                m = whole_model(wl, build_member(wl, ctx.device, ctx.seed + 1000 * (k + 1)), ctx)
                o = make_optimizer(m.parameters(), ctx)
                for b in seen:
                    train_step(m, wl, ctx, o, local_share(b, ctx, rank=k))
                outs.append(predict(m, x))
                del m, o
            ref = float(wl.loss(torch.stack(outs).mean(0), y))
            return abs(result["loss"] - ref) / max(abs(ref), 1e-12)

        return Step(run=run, loss_weight=1.0 / w, finish=finish, self_parity=self_parity, optimizer=opt)
