"""Pipeline parallelism with micro-batches through torch.distributed.pipelining.

The model is cut into contiguous stages, one per rank (two per rank for the interleaved schedule),
with equal numbers of transformer blocks per stage (option ``pp_balance=blocks``, the default, as
torchtitan splits a model's layers); ``time`` balances the forward+backward time of each block
measured once on the device, ``params`` balances parameter counts, which gives the embedding as much
weight as a transformer block. The embedding lands on the first stage and the head on the last, as
in torchtitan's pipeline split. ``micro_batches`` (option, default
max(4, 2 x stages)) splits each batch.

Bubble: ``bubble_theory`` is (p-1)/(m+p-1) for GPipe and 1F1B, (p-1)/(v*m+p-1) interleaved: the
bubble of equal stages. ``bubble_measured`` is the idle fraction of the busiest rank: 1 - busy /
step time, where busy is m x (forward+backward of one micro-batch through the rank's stages, timed
alone after the run). Communication between stages therefore counts as idle, as it does for the
pipeline. Stages are rarely equal (the last one carries the head and the loss), so the step the
schedule should take with the stages as they are is modelled too (one loop per rank): the first
micro-batch passes every stage, the other m-1 follow at the pace of the slowest,
``stage_model_step_s`` = sum(t_i) + (m-1) x max(t_i) with t_i a rank's busy time per micro-batch,
and ``bubble_stages`` = 1 - m x max(t_i) / that step, which is ``bubble_theory`` for equal stages.
``pipeline_gap`` (timed median / modelled step - 1) says how far the pipeline runs from its own
schedule: time spent between stages (transfers, waits, the schedule's host work).
"""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

from bench.core import backends
from bench.core.memory import Terms
from bench.core.mesh import Mesh
from bench.core.spec import CellSpec, WorkloadFacts
from bench.workloads import Workload
from strategies import catalog
from strategies.allreduce import allreduce_mean_bucketed
from strategies.base import Context, Step, Strategy, common_check
from strategies.catalog import BUCKET_MB
from strategies.common import (
    block_costs,
    build_for_sharding,
    cell_mesh,
    hybrid_mesh,
    local_share,
    materialize,
    mesh_check,
    param_costs,
    partition,
    placement_check,
    placement_label,
    stage_modules,
    time_region,
)
from strategies.memory import block_elements, cut_terms, layout, pipeline_in_flight
from strategies.training import compile_blocks, make_optimizer, prepare_blocks

SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B, "interleaved-1f1b": ScheduleInterleaved1F1B}



def default_micro_batches(pp: int) -> int:
    return max(4, 2 * pp)



def stage_model(busy: list[float], m: int) -> tuple[float, float]:
    """(step, bubble of the busiest rank) a one-loop schedule takes with per-rank busy times ``busy``
    (each m micro-batches' forward+backward): sum(t) + (m-1) x max(t), t = busy / m."""
    t = [b / m for b in busy]
    step = sum(t) + (m - 1) * max(t)
    return step, 1 - m * max(t) / step



def pipeline_check(wl: WorkloadFacts, cell: CellSpec, *, pp: int, dp: int, virtual: int) -> str | None:
    reason = backends.get(cell.backend).p2p_unsupported(cell.device)
    if reason:
        return reason
    m = cell.options["micro_batches"]
    if wl.n_blocks < pp * virtual:
        return f"{wl.n_blocks} blocks cannot fill {pp * virtual} stages"
    if m < pp:
        return f"micro_batches={m} < {pp} stages; the schedules need at least one per stage"
    if virtual > 1 and m % pp:
        return f"interleaved 1F1B needs micro_batches ({m}) divisible by the stages per loop ({pp})"
    if wl.global_batch % (dp * m):
        return f"global batch {wl.global_batch} does not divide into {dp} x {m} micro-batches"
    return None


def equal_blocks(n: int) -> list[float]:
    """Stage-cut costs of ``pp_balance=blocks``: equal transformer blocks per stage, the embedding
    and the head (the first and last of more than two blocks) riding along at no cost."""
    return [0.0] + [1.0] * (n - 2) + [0.0] if n > 2 else [1.0] * n


@dataclass(frozen=True, kw_only=True)
class StageLayout:
    """Where this rank sits in a pipeline: its schedule, its rank among the ``pp`` stages (each
    ``virtual`` stages deep), the micro-batches ``m``, the pipeline's process group (None: the
    default group) and the data-parallel degree ``dp`` around it."""

    schedule: str
    pp_rank: int
    pp: int
    m: int
    group: dist.ProcessGroup | None = None
    virtual: int = 1
    dp: int = 1


class PipelineRunner:
    """This rank's stages and schedule; ``run(local_batch)`` does one training step."""

    def __init__(self, wl: Workload, ctx: Context, layout: StageLayout):
        schedule, pp_rank, pp, m = layout.schedule, layout.pp_rank, layout.pp, layout.m
        group, virtual, dp = layout.group, layout.virtual, layout.dp
        self.wl, self.ctx, self.m, self.pp = wl, ctx, m, pp
        n_stages = pp * virtual
        balance = ctx.options.get("pp_balance", "blocks")
        # Timing the blocks needs the whole model on the device of the rank that times them (global
        # rank 0, block_costs); the other ranks, and the other cuts, build it on the meta device where
        # the workload allows, and allocate their stages only.
        timer = balance == "time" and dist.get_rank() == 0
        model = wl.build(ctx.device) if timer else build_for_sharding(wl, ctx)
        costs = None
        if balance == "time":
            x, y = wl.batch(0)
            rows = x.shape[0] // (dp * m)
            costs = block_costs(wl, model, ctx, (x[:rows], y[:rows]))
        elif balance == "blocks":
            costs = equal_blocks(len(wl.blocks(model)))
        prepare_blocks(wl, model, ctx, compile_each=False)
        parts = stage_modules(wl, model, n_stages, costs)
        self.stage_blocks = [len(p) for p in parts]
        self.ids = [pp_rank + i * pp for i in range(virtual)]  # looped assignment
        self.mods: list[nn.Module] = [parts[i] for i in self.ids]
        materialize(wl, model, [(mod, ctx.device) for mod in self.mods])
        compile_blocks(self.mods, ctx)  # per stage
        del parts, model
        stages = [PipelineStage(self.mods[k], sid, n_stages, ctx.device, group=group)
                  for k, sid in enumerate(self.ids)]
        cls = SCHEDULES[schedule]
        loss_fn = lambda out, y: wl.loss(out, y)
        self.schedule = cls(stages if virtual > 1 else stages[0], n_microbatches=m, loss_fn=loss_fn)
        self.first, self.last = 0 in self.ids, n_stages - 1 in self.ids
        self.opt = make_optimizer([p for mod in self.mods for p in mod.parameters()], ctx)
        self.virtual = virtual
        self.step_kw = ({"return_outputs": False}
                        if "return_outputs" in inspect.signature(self.schedule.step).parameters else {})
        self._inputs: dict[int, tuple] = {}
        for k, mod in enumerate(self.mods):  # keep one micro-batch input per stage for the busy timing
            mod.register_forward_pre_hook(lambda _m, args, k=k: self._inputs.__setitem__(k, args))

    def step(self, batch, after_backward=None):
        x, y = batch
        losses: list[torch.Tensor] = []
        args = (x,) if self.first else ()
        kwargs = {"target": y, "losses": losses} if self.last else {}
        with self.ctx.autocast():
            # The last stage's merged output (all micro-batches' logits) is never read: do not build it
            # (torchtitan passes return_outputs=False too).
            self.schedule.step(*args, **kwargs, **self.step_kw)
        if after_backward is not None:
            after_backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return torch.stack([loss.detach().float() for loss in losses]).mean() if self.last else None

    def busy_seconds(self, target: torch.Tensor) -> float:
        """m x (forward + backward of one micro-batch through this rank's stages), timed alone."""
        total = 0.0
        mb_target = target[: target.shape[0] // self.m]
        for k, mod in enumerate(self.mods):
            inp = tuple(a.detach().requires_grad_(a.is_floating_point()) for a in self._inputs[k])
            is_last = self.ids[k] == self.pp * self.virtual - 1

            def fb(mod=mod, inp=inp, is_last=is_last):
                with self.ctx.autocast():
                    out = mod(*inp)
                (self.wl.loss(out, mb_target) if is_last else out.float().sum()).backward()

            total += self.m * time_region(self.ctx.device, fb)
        self.opt.zero_grad(set_to_none=True)
        return total

    def theory(self) -> float:
        return (self.pp - 1) / (self.virtual * self.m + self.pp - 1)


class Pipeline(Strategy):
    declared = catalog.PIPELINE_GPIPE
    schedule = "gpipe"
    virtual = 1

    def min_share(self, cell: CellSpec) -> float:
        return 1 / self.degrees(cell.n_devices, cell.options)[1]  # pp stages, each replicated dp times

    def memory_terms(self, cell: CellSpec) -> Terms:
        """The fullest pipeline rank's stages (strategies.memory.cut_terms), cut as
        :class:`PipelineRunner` cuts them (``partition`` of the same costs: ``pp_balance=blocks``
        equal blocks, ``params`` parameter counts; ``time`` is measured only when the cell runs, so
        the equal-blocks cut stands in for it, approximate); the micro-batch is the global batch over
        dp x ``micro_batches``, in flight as many as the schedule holds on its first rank
        (strategies.memory.pipeline_in_flight), each stage receiving into one buffer a micro-batch.
        Without the planner's layout: 1/pp of everything, approximate."""
        dp, pp = self.degrees(cell.n_devices, cell.options)
        m, v = cell.options["micro_batches"], self.virtual
        base = super().memory_terms(cell)
        ps = layout(cell.workload)
        if ps is None:
            return dataclasses.replace(base, micro_batch=cell.workload.global_batch // (dp * m), how="approximate")
        n = cell.workload.n_blocks
        balance = cell.options.get("pp_balance", "blocks")
        costs = param_costs(block_elements(ps, n)) if balance == "params" else equal_blocks(n)
        bounds = partition(costs, pp * v)
        ranks = [[bounds[r + i * pp] for i in range(v)] for r in range(pp)]
        return cut_terms(cell.workload, ps, ranks, micro_batch=cell.workload.global_batch // (dp * m),
                         in_flight=pipeline_in_flight(self.schedule, pp, m, v), messages=m,
                         bucket_cap=int(cell.options.get("bucket_mb", BUCKET_MB.default) * 2**20) if dp > 1 else None,
                         communicators=base.communicators)

    def mesh(self, n: int, options: dict) -> Mesh:
        """The cell's layout: n pipeline stages (a 2D hybrid: data parallel x pipeline)."""
        return Mesh.line("pp", n)

    def degrees(self, n: int, options: dict) -> tuple[int, int]:
        """(data-parallel, pipeline) degrees."""
        mesh = self.mesh(n, options)
        return mesh.dp, mesh.degree("pp")

    def resolve_options(self, n_devices: int, given: dict) -> dict:
        out = super().resolve_options(n_devices, given)
        if out.get("micro_batches") is None:
            out["micro_batches"] = default_micro_batches(self.degrees(n_devices, out)[1])
        return out

    def check(self, cell: CellSpec, *, gpus: int) -> str | None:
        return common_check(cell, gpus=gpus, min_world=self.min_world) or pipeline_check(
            cell.workload, cell, pp=cell.n_devices, dp=1, virtual=self.virtual)

    def label_values(self, cell: CellSpec) -> dict:
        return {"schedule": self.schedule, "micro_batches": cell.options["micro_batches"],
                "mesh": self.mesh(cell.n_devices, cell.options).label}

    def prepare(self, wl: Workload, ctx: Context) -> Step:
        pp = ctx.world_size
        runner = PipelineRunner(wl, ctx, StageLayout(schedule=self.schedule, pp_rank=ctx.rank, pp=pp,
                                                     m=ctx.options["micro_batches"], virtual=self.virtual))
        return pipeline_step(runner, wl, ctx, lambda b: ctx.to_device(b), dp=1)


def pipeline_step(runner: PipelineRunner, wl: Workload, ctx: Context, share, *, dp: int,
                  after_backward=None) -> Step:
    last_batch: dict[str, torch.Tensor] = {}

    def run(b):
        x, y = share(b)
        last_batch["y"] = y
        return runner.step((x, y), after_backward)

    def finish():
        # Every rank takes part in the gather below, also one whose busy timing failed (it sends
        # None, then raises): a rank left out would hold the others in the collective until the
        # group's timeout.
        busy, error = None, None
        try:
            busy = runner.busy_seconds(last_batch["y"])
        except Exception as e:  # noqa: BLE001 - raised again after the gather
            error = e
        everyone: list = [None] * ctx.world_size
        dist.all_gather_object(everyone, (runner.ids[0], busy))  # ids[0] is the pipeline rank
        if error is not None:
            raise error
        out = {"stage_busy_s": busy, "bubble_theory": runner.theory(),
               "stage_blocks": "/".join(map(str, runner.stage_blocks))}
        # The slowest data-parallel replica of each pipeline rank.
        per_stage: dict[int, float] = {}
        for pp_rank, b in everyone:
            if b is not None:
                per_stage[pp_rank] = max(per_stage.get(pp_rank, 0.0), b)
        if runner.virtual == 1 and len(per_stage) == runner.pp and all(b is not None for _, b in everyone):
            out["stage_model_step_s"], out["bubble_stages"] = stage_model(list(per_stage.values()), runner.m)
        return out

    return Step(run=run, loss_weight=(1.0 / dp) if runner.last else 0.0, finish=finish, optimizer=runner.opt)


class Pipeline1F1B(Pipeline):
    declared = catalog.PIPELINE_1F1B
    schedule = "1f1b"


class PipelineInterleaved(Pipeline):
    declared = catalog.PIPELINE_INTERLEAVED
    schedule = "interleaved-1f1b"
    virtual = 2


class DPxPipeline(Pipeline):
    declared = catalog.DP_PP
    schedule = "1f1b"

    def mesh(self, n: int, options: dict) -> Mesh:
        return cell_mesh(options, n, "pp")

    def label_values(self, cell: CellSpec) -> dict:
        return {**super().label_values(cell), "mesh_placement": placement_label(cell, "pp")}

    def check(self, cell: CellSpec, *, gpus: int) -> str | None:
        r = common_check(cell, gpus=gpus) or mesh_check(cell) or placement_check(cell, "pp")
        if r:
            return r
        dp, pp = self.degrees(cell.n_devices, cell.options)
        return pipeline_check(cell.workload, cell, pp=pp, dp=dp, virtual=1)

    def prepare(self, wl: Workload, ctx: Context) -> Step:
        # DDP on the data-parallel dimension of a pipeline trips a reducer assertion
        # (params_.size() == rebuilt_param_indices_.size()) unless there is one micro-batch, so the
        # dp gradients are all-reduced by hand.
        dp, pp = self.degrees(ctx.world_size, ctx.options)
        mesh = hybrid_mesh(ctx.device.type, dp, pp, ctx.options["placement"], ("dp", "pp"))
        runner = PipelineRunner(wl, ctx, StageLayout(schedule=self.schedule, pp_rank=mesh.get_local_rank("pp"), pp=pp,
                                                     m=ctx.options["micro_batches"], group=mesh.get_group("pp"), dp=dp))
        dp_group, dp_rank = mesh.get_group("dp"), mesh.get_local_rank("dp")
        params = [p for mod in runner.mods for p in mod.parameters()]
        cap = int(ctx.options["bucket_mb"] * 2**20)

        def reduce_dp():
            allreduce_mean_bucketed([p.grad for p in params], cap, world=dp, group=dp_group)

        return pipeline_step(runner, wl, ctx, lambda b: local_share(b, ctx, rank=dp_rank, world=dp), dp=dp,
                             after_backward=reduce_dp)
