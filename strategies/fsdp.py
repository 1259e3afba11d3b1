"""FSDP2 (``fully_shard``): parameters, gradients and optimizer state sharded over the ranks.

Configured after torchtitan's ``apply_fsdp`` (torchtitan/models/llama3/infra/parallelize.py) and
the FSDP2 tutorial, except where noted:

* each inner block (a transformer block) is its own FSDP unit, all-gathered just before it runs;
  the first and last pieces of the workload (for the GPT: the embedding and the head) stay in the
  root unit, which FSDP2 gathers once at the start of forward and does not reshard after it (the
  root's ``reshard_after_forward`` is treated as False), as ``tools/baselines/plain_fsdp.py``
  does. torchtitan's current ``apply_fsdp`` differs: the embedding is a unit of its own (resharded
  after forward) and the final norm with the output head another (not resharded by default).
  Option ``fsdp_units=all`` makes every piece its own unit (the embedding resharded as torchtitan
  does; measured on CPU, gpt-tiny, 2 ranks, 4 interleaved rounds: 1.14x the plain loop's step,
  against 0.91-0.96x with ``inner``). The rule is positional: for a workload whose first or last
  piece is a real compute layer (the mlp's first hidden layer, the convnet's stem) that layer is
  gathered once with the root; with fewer than three pieces every piece is a unit. The cell records
  the units it built (``fsdp_units_built``);
* with bf16 precision, ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``: the
  all-gathers move bf16 and the blocks compute in bf16 without autocast, gradients are reduced in
  fp32 into the fp32 sharded parameters (option ``fsdp_mp=off`` keeps fp32 parameters under
  autocast, so a user can see what the policy is worth);
* ``reshard_after_forward`` on every block but the last: the last block's backward starts right
  after its forward, so freeing and re-gathering its parameters would only add an all-gather
  (option ``fsdp_reshard_last=true`` reshards it too). ``fsdp-noreshard`` keeps every block gathered
  from forward to backward (ZeRO-2-like: more memory, fewer all-gathers).

FSDP2's implicit prefetching (the next block's all-gather is issued while the current one runs)
is left on; explicit ``set_modules_to_forward_prefetch`` brought nothing measurable at this depth.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from bench.core.memory import Terms
from bench.core.spec import CellSpec
from bench.workloads import Workload
from strategies import catalog
from strategies.base import Context, Step, Strategy, policy_text
from strategies.common import build_for_sharding, local_share, materialize, param_count, train_step
from strategies.ddp import data_parallel_check
from strategies.memory import Param, held, layout, local_elements, shares
from strategies.training import inner_blocks, make_optimizer, prepare_blocks


def mixed_precision(options: dict, precision: str) -> MixedPrecisionPolicy | None:
    """The policy for these options, None for fp32 parameters."""
    if precision == "bf16" and options.get("fsdp_mp", "auto") == "auto":
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return None


def fsdp_policy(cell: CellSpec) -> str:
    """The precision policy of a cell sharded by FSDP2 under its ``fsdp_mp`` option."""
    return policy_text(cell.measure.precision,
                       cast_params=mixed_precision(cell.options, cell.measure.precision) is not None)


def unit_blocks(wl: Workload, model, units: str = "inner") -> list:
    """The modules that become their own FSDP unit: the inner blocks (:func:`strategies.training.inner_blocks`:
    the first and last pieces stay in the root unit) when ``units`` is 'inner', else every piece
    that holds parameters."""
    if units == "inner":
        return inner_blocks(wl, model)
    return [b for b in wl.blocks(model) if param_count(b)]


def shard_model(wl: Workload, model, mesh, *, reshard: bool, mp: MixedPrecisionPolicy | None = None,
                reshard_last: bool = False, units: str = "inner") -> int:
    """fully_shard every unit block (:func:`unit_blocks`), then the root; returns the units built
    besides the root."""
    kw = {"mp_policy": mp} if mp is not None else {}
    blocks = unit_blocks(wl, model, units)
    inside = {id(m) for m in model.modules()}
    if any(id(b) not in inside for b in blocks):
        raise ValueError(f"workload {wl.name}: blocks(model) returned modules that are not submodules of the model; "
                         "FSDP shards the modules the forward calls, so blocks must return those")
    for i, block in enumerate(blocks):
        last = i == len(blocks) - 1
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard and (reshard_last or not last), **kw)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard, **kw)
    return len(blocks)


def unit_indices(n_blocks: int, ps: Sequence[Param], units: str = "inner") -> list[int]:
    """The blocks :func:`unit_blocks` makes units of, by index: the inner ones (all of them with
    fewer than three), or every one, that hold parameters."""
    idx = list(range(1, n_blocks - 1)) if units == "inner" and n_blocks >= 3 else list(range(n_blocks))
    holding = {p.block for p in ps}
    return [i for i in idx if i in holding]


def fsdp_terms(cell: CellSpec, ps: Sequence[Param], *, dp: int, reshard: bool, micro_batch: int,
               tp_dims: Sequence[int] | None = None, tp: int = 1) -> Terms:
    """FSDP2's terms over ``dp`` ranks (each parameter first cut by tensor parallel along
    ``tp_dims`` over ``tp``, as fsdp-tp does).

    Held: every rank keeps each parameter's dim-0 shard padded to ceil(rows / dp) rows
    (:func:`strategies.memory.local_elements`), its gradient (the reduce-scatter output) and
    optimizer state at the same size. Buffers (approximate: when FSDP2 frees a gathered unit
    depends on its streams and the caching allocator): the root's parameters, all-gathered at the
    start of forward and kept to the end of backward; under ``reshard`` the two largest units at
    once (the one computing and the one prefetched: the last block, kept gathered from its forward
    into its backward, and the next backward all-gather FSDP2 issues early), without it every unit
    (each kept gathered from forward to backward); each gathered at dp x the padded shard in the
    gather dtype (the policy's bf16, else the parameter's); plus the reduce-scatter input of the
    largest unit, its whole padded gradient in the reduce dtype (fp32 under the policy, else the
    parameter's)."""
    tp_dims = tp_dims or [-1] * len(ps)
    cast = mixed_precision(cell.options, cell.measure.precision) is not None

    def local(i: int) -> int:
        return local_elements(ps[i].shape, tp_dim=tp_dims[i], tp=tp, dp=dp)

    rank = held([dataclasses.replace(p, shape=(local(i),)) for i, p in enumerate(ps)])
    params, grads, state = shares([rank], ps)
    units = unit_indices(cell.workload.n_blocks, ps, cell.options.get("fsdp_units", "inner"))
    gathered: dict[int, float] = {}
    scatter: dict[int, float] = {}
    for i, p in enumerate(ps):
        unit = p.block if p.block in units else -1  # -1: the root
        gathered[unit] = gathered.get(unit, 0.0) + dp * local(i) * (2 if cast else p.element)
        if p.trainable:
            scatter[unit] = scatter.get(unit, 0.0) + dp * local(i) * (4 if cast else p.element)
    inner = sorted((v for k, v in gathered.items() if k != -1), reverse=True)
    live = inner if not reshard else inner[:2]
    buffers = gathered.get(-1, 0.0) + sum(live) + max(scatter.values(), default=0.0)
    return Terms(params=params, grads=grads, state=state, micro_batch=micro_batch, buffers=buffers,
                 buffers_note="FSDP2's all-gathered units and reduce-scatter input",
                 communicators=1 if cell.n_procs > 1 and cell.backend == "nccl" else 0,
                 how="approximate")  # the buffers: see above


class FSDP(Strategy):
    declared = catalog.FSDP
    reshard = True

    def check(self, cell: CellSpec, *, gpus: int) -> str | None:
        return data_parallel_check(cell, gpus=gpus)

    def label_values(self, cell: CellSpec) -> dict:
        mp = mixed_precision(cell.options, cell.measure.precision)
        return {"reshard_after_forward": self.reshard, "fsdp_param_dtype": "bf16" if mp else "fp32"}

    def precision_policy(self, cell: CellSpec) -> str:
        return fsdp_policy(cell)

    def memory_terms(self, cell: CellSpec) -> Terms:
        """:func:`fsdp_terms` over every rank; without the planner's layout, 1/n of everything and
        no buffers (approximate)."""
        ps = layout(cell.workload)
        if ps is None:
            return dataclasses.replace(super().memory_terms(cell), how="approximate")
        return fsdp_terms(cell, ps, dp=cell.n_devices, reshard=self.reshard,
                          micro_batch=-(-cell.workload.global_batch // cell.n_devices))

    def prepare(self, wl: Workload, ctx: Context) -> Step:
        mesh = init_device_mesh(ctx.device.type, (ctx.world_size,))
        model = build_for_sharding(wl, ctx)
        prepare_blocks(wl, model, ctx)  # checkpointing, then compile, per block: before fully_shard
        mp = mixed_precision(ctx.options, ctx.precision)
        units = shard_model(wl, model, mesh, reshard=self.reshard, mp=mp,
                            reshard_last=ctx.options["fsdp_reshard_last"], units=ctx.options["fsdp_units"])
        materialize(wl, model, [(model, ctx.device)])  # this rank's shards only
        opt = make_optimizer(model.parameters(), ctx)
        # Under the policy FSDP casts parameters itself; autocast on top would push norms back to fp32.
        return Step(run=lambda b: train_step(model, wl, ctx, opt, local_share(b, ctx), autocast=mp is None),
                    loss_weight=1.0 / ctx.world_size, optimizer=opt, finish=lambda: {"fsdp_units_built": units})


class FSDPNoReshard(FSDP):
    declared = catalog.FSDP_NORESHARD
    reshard = False
