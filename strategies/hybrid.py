"""2D hybrids on a DeviceMesh (dp x mp): FSDP2 over data parallel x tensor parallel."""

from __future__ import annotations

import dataclasses

from bench.core.memory import Terms
from bench.core.spec import CellSpec
from bench.workloads import Workload
from strategies import catalog
from strategies.base import Context, Step, Strategy, common_check
from strategies.common import (
    build_for_sharding,
    cell_mesh,
    hybrid_mesh,
    local_share,
    materialize,
    mesh_check,
    placement_check,
    placement_label,
    train_step,
)
from strategies.ddp import divisible
from strategies.fsdp import fsdp_policy, fsdp_terms, mixed_precision, shard_model
from strategies.tensor import apply_tp, compiled_selective_reason, tp_check, tp_layout
from strategies.training import make_optimizer, prepare_blocks


class FSDPxTP(Strategy):
    declared = catalog.FSDP_TP

    def knob_reason(self, cell: CellSpec) -> str | None:
        return super().knob_reason(cell) or compiled_selective_reason(cell)

    def precision_policy(self, cell: CellSpec) -> str:
        return fsdp_policy(cell)

    def check(self, cell: CellSpec, *, gpus: int) -> str | None:
        r = common_check(cell, gpus=gpus) or mesh_check(cell) or placement_check(cell, "tp")
        if r:
            return r
        mesh = cell_mesh(cell.options, cell.n_devices, "tp")
        return tp_check(cell.workload, mesh.mp) or divisible(cell.workload.global_batch, mesh.dp)

    def label_values(self, cell: CellSpec) -> dict:
        mp = mixed_precision(cell.options, cell.measure.precision)
        return {"mesh": cell_mesh(cell.options, cell.n_devices, "tp").label,
                "fsdp_param_dtype": "bf16" if mp else "fp32", "mesh_placement": placement_label(cell, "tp")}

    def memory_terms(self, cell: CellSpec) -> Terms:
        """FSDP2's terms (strategies.fsdp.fsdp_terms) over the mesh's data-parallel ranks, each
        parameter first cut by the tensor-parallel plan over its row; every rank of a row sees the
        row's share of the batch. Without the planner's layout: 1/n of everything, approximate."""
        grid = cell_mesh(cell.options, cell.n_devices, "tp")
        got = tp_layout(cell)
        batch = -(-cell.workload.global_batch // grid.dp)
        if got is None:
            return dataclasses.replace(super().memory_terms(cell), micro_batch=batch, how="approximate")
        ps, dims = got
        return fsdp_terms(cell, ps, dp=grid.dp, reshard=True, micro_batch=batch, tp_dims=dims, tp=grid.mp)

    def prepare(self, wl: Workload, ctx: Context) -> Step:
        grid = cell_mesh(ctx.options, ctx.world_size, "tp")
        dp, tp = grid.dp, grid.mp
        mesh = hybrid_mesh(ctx.device.type, dp, tp, ctx.options["placement"], ("dp", "tp"))
        model = build_for_sharding(wl, ctx)
        loss_ctx = apply_tp(wl, model, mesh["tp"], ctx)
        prepare_blocks(wl, model, ctx, dtensor=True)  # after the plan, before fully_shard
        mp = mixed_precision(ctx.options, ctx.precision)
        units = shard_model(wl, model, mesh["dp"], reshard=True, mp=mp, units=ctx.options["fsdp_units"])
        materialize(wl, model, [(model, ctx.device)])
        opt = make_optimizer(model.parameters(), ctx)
        dp_rank = mesh.get_local_rank("dp")
        return Step(run=lambda b: train_step(model, wl, ctx, opt, local_share(b, ctx, rank=dp_rank, world=dp),
                                             autocast=mp is None, loss_context=loss_ctx),
                    loss_weight=1.0 / ctx.world_size, optimizer=opt, finish=lambda: {"fsdp_units_built": units})
