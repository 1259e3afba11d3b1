"""Tensor parallelism (torch.distributed.tensor.parallel) through the workload's own plan.

Which modules are split, and how, depends on the model's module names, so the plan belongs to
the workload (``Workload.tp_plan``; the built-in GPT's, ``bench.workloads.gpt.tensor_parallel``,
offers the Megatron column/row split, the default, and torchtitan's llama plan with sequence
parallel on the norms and loss parallel, ``tp_plan=sp``), as torchtitan keeps each model's
parallelize function with the model. A workload without a plan is skipped with that
reason, never run unsplit; a plan that splits nothing fails the distribution check. Every rank
sees the whole batch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from torch.distributed.device_mesh import init_device_mesh

from bench.core.memory import Terms
from bench.core.mesh import Mesh
from bench.core.spec import CellSpec, WorkloadFacts
from bench.workloads import Workload
from strategies import catalog
from strategies.base import Context, Step, Strategy, common_check
from strategies.catalog import TP_PLAN
from strategies.common import build_for_sharding, materialize, train_step
from strategies.memory import Param, held, layout, local_elements, shares
from strategies.training import make_optimizer, prepare_blocks


def tp_check(wl: WorkloadFacts, tp: int) -> str | None:
    if not wl.has_tp_plan:
        return (f"workload {wl.name} declares no tensor-parallel plan (Workload.tp_plan); "
                "give its factory one to run tensor parallel")
    if wl.n_heads is not None and wl.n_heads % tp:
        return f"{wl.n_heads} attention heads do not divide by tensor-parallel degree {tp}"
    return None



def apply_tp(wl: Workload, model, mesh, ctx: Context):
    """Apply the workload's plan; returns the loss context it needs (or None). A plan that splits no
    parameter fails the cell here: under FSDP (fsdp-tp) the data-parallel sharding alone would
    otherwise pass the distribution check."""
    from torch.distributed.tensor import DTensor

    assert wl.tp_plan is not None, "planner checks has_tp_plan"
    loss_ctx = wl.tp_plan(model, mesh, plan=ctx.options.get("tp_plan", TP_PLAN.default))
    if mesh.size() > 1 and not any(isinstance(p, DTensor) and p.device_mesh == mesh for p in model.parameters()):
        raise ValueError(f"did not distribute: the tensor-parallel plan of {wl.name} split no parameter "
                         "(its module names do not match the plan?)")
    return loss_ctx


def tp_layout(cell: CellSpec) -> tuple[list[Param], tuple[int, ...]] | None:
    """The parameters and the dimension the cell's plan (option ``tp_plan``) shards each along,
    as the planner recorded them applying the plan on the meta device; None where it could not."""
    ps, dims = layout(cell.workload), (cell.workload.tp_dims or {}).get(cell.options.get("tp_plan", TP_PLAN.default))
    return None if ps is None or dims is None or len(dims) != len(ps) else (ps, dims)


def tp_shares(ps: Sequence[Param], dims: Sequence[int], tp: int) -> tuple[float, float, float]:
    """(params, grads, state) shares of tensor-parallel rank 0, the fullest: a sharded parameter's
    DTensor keeps torch.chunk's first (largest) piece along its dimension, a replicated one all of
    it; gradients and optimizer state are the same DTensors' and tensors' sizes."""
    rank = held([dataclasses.replace(p, shape=(local_elements(p.shape, tp_dim=d, tp=tp),))
                 for p, d in zip(ps, dims)])
    return shares([rank], ps)


def compiled_selective_reason(cell: CellSpec) -> str | None:
    """Why a tensor-parallel cell cannot compile under selective checkpointing, or None."""
    if cell.training.compile == "on" and cell.training.ac == "selective":
        return ("compile=on with ac=selective under tensor parallelism: selective checkpointing refuses the "
                "compiled DTensor block (a cached tensor is mutated); use --ac full or --compile off")
    return None


class TensorParallel(Strategy):
    declared = catalog.TENSOR

    def check(self, cell: CellSpec, *, gpus: int) -> str | None:
        return common_check(cell, gpus=gpus) or tp_check(cell.workload, cell.n_devices)

    def label_values(self, cell: CellSpec) -> dict:
        return {"mesh": Mesh.line("tp", cell.n_devices).label}

    def knob_reason(self, cell: CellSpec) -> str | None:
        return super().knob_reason(cell) or compiled_selective_reason(cell)

    def memory_terms(self, cell: CellSpec) -> Terms:
        """The plan's shares (:func:`tp_shares`) and the whole global batch as the micro-batch
        (every rank sees all of it). Approximate: the activations, kept whole (an upper bound):
        the split linears' outputs and the attention inside are 1/tp, but the residual stream, the
        norms' inputs (Megatron) and every linear's gathered input (sequence parallel) are not.
        Without the planner's layout, 1/n of the parameters."""
        base = super().memory_terms(cell)
        got = tp_layout(cell)
        base = dataclasses.replace(base, micro_batch=cell.workload.global_batch, how="approximate")
        if got is None:
            return base
        params, grads, state = tp_shares(*got, cell.n_devices)
        return dataclasses.replace(base, params=params, grads=grads, state=state)

    def prepare(self, wl: Workload, ctx: Context) -> Step:
        mesh = init_device_mesh(ctx.device.type, (ctx.world_size,))
        model = build_for_sharding(wl, ctx)
        loss_ctx = apply_tp(wl, model, mesh, ctx)
        prepare_blocks(wl, model, ctx, dtensor=True)  # checkpointing, then compile, per block: after the plan
        materialize(wl, model, [(model, ctx.device)])
        opt = make_optimizer(model.parameters(), ctx)
        # Every rank computes the same whole-batch loss.
        return Step(run=lambda b: train_step(model, wl, ctx, opt, ctx.to_device(b), loss_context=loss_ctx),
                    loss_weight=1.0 / ctx.world_size, optimizer=opt)
