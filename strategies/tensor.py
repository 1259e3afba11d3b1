"""Tensor parallelism on the transformer (torch.distributed.tensor.parallel), Megatron style.

In every GPT block, q/k/v and the MLP's up projection are split column-wise (each rank owns some
heads and some of the hidden units) and the attention output and MLP down projection row-wise, so
each block costs one all-reduce in forward and one in backward per sub-layer. Every rank sees the
whole batch. Embedding, norms and head stay replicated.
"""

from __future__ import annotations

from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from bench.workloads import Workload
from bench.workloads.gpt import Block
from strategies.base import Cell, Context, Step, Strategy, common_check, make_optimizer, train_step

PLAN = {"attn.q": ColwiseParallel(), "attn.k": ColwiseParallel(), "attn.v": ColwiseParallel(),
        "attn.o": RowwiseParallel(), "mlp.up": ColwiseParallel(), "mlp.down": RowwiseParallel()}


def tp_check(wl: Workload, tp: int) -> str | None:
    if wl.n_heads is None:
        return f"tensor parallel is defined for the GPT workloads (attention heads); {wl.name} has none"
    if wl.n_heads % tp:
        return f"{wl.n_heads} attention heads do not divide by tensor-parallel degree {tp}"
    return None


def apply_tp(model, mesh) -> None:
    for block in model.modules():
        if isinstance(block, Block):
            parallelize_module(block, mesh, PLAN)


class TensorParallel(Strategy):
    name = "tensor"
    summary = "tensor parallel: column-wise then row-wise linears in attention and MLP"
    needs = "a GPT workload; heads divisible by world size; world size <= devices"

    def check(self, cell: Cell, wl: Workload) -> str | None:
        return common_check(cell) or tp_check(wl, cell.world_size)

    def prepare(self, wl: Workload, ctx: Context) -> Step:
        mesh = init_device_mesh(ctx.device.type, (ctx.world_size,))
        model = wl.build(ctx.device)
        apply_tp(model, mesh)
        opt = make_optimizer(model.parameters(), ctx)
        # Every rank computes the same whole-batch loss.
        return Step(run=lambda b: train_step(model, wl, ctx, opt, ctx.to_device(b)),
                    loss_weight=1.0 / ctx.world_size, model=model, extra={"mesh": f"tp{ctx.world_size}"})
