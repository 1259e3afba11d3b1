"""2D hybrids on a DeviceMesh (dp x mp): FSDP2 over data parallel x tensor parallel."""

from __future__ import annotations

from torch.distributed.device_mesh import init_device_mesh

from bench.spec import CellSpec
from bench.workloads import Workload
from strategies.base import MESH, Context, Step, Strategy, common_check
from strategies.common import MESH_OPTION, local_share, make_optimizer, mesh_check, parse_mesh, train_step
from strategies.ddp import divisible
from strategies.fsdp import shard_model
from strategies.tensor import apply_tp, tp_check


class FSDPxTP(Strategy):
    name = "fsdp-tp"
    summary = "2D: tensor parallel inside each mesh row, FSDP2 across rows (option mesh='DPxTP')"
    needs = "world size >= 4 = dp x tp (default dp=2); GPT workload; heads divisible by tp"
    options = (MESH_OPTION,)
    labels = (MESH,)

    def check(self, cell: CellSpec, *, gpus: int) -> str | None:
        r = common_check(cell, gpus=gpus) or mesh_check(cell)
        if r:
            return r
        dp, tp = parse_mesh(cell.options["mesh"], cell.n_devices)
        return tp_check(cell.workload, tp) or divisible(cell.workload.global_batch, dp)

    def label_values(self, cell: CellSpec) -> dict:
        dp, tp = parse_mesh(cell.options["mesh"], cell.n_devices)
        return {"mesh": f"dp{dp}xtp{tp}"}

    def prepare(self, wl: Workload, ctx: Context) -> Step:
        dp, tp = parse_mesh(ctx.options["mesh"], ctx.world_size)
        mesh = init_device_mesh(ctx.device.type, (dp, tp), mesh_dim_names=("dp", "tp"))
        model = wl.build(ctx.device)
        apply_tp(wl, model, mesh["tp"], ctx)
        shard_model(wl, model, mesh["dp"], reshard=True)
        opt = make_optimizer(model.parameters(), ctx)
        dp_rank = mesh.get_local_rank("dp")
        return Step(run=lambda b: train_step(model, wl, ctx, opt, local_share(b, ctx, rank=dp_rank, world=dp)),
                    loss_weight=1.0 / ctx.world_size)
