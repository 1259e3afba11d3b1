"""Model parallelism across processes, by hand: consecutive blocks on consecutive ranks.

Rank r receives the activation from r-1, runs its blocks, sends the result to r+1; the last rank
computes the loss; gradients travel back the same way. No micro-batches: while one rank works the
others wait, and this strategy exists to make that cost visible next to the pipelines.

``encoder-head`` is the collaborating-models case on two ranks: an encoder (every block but the
last) on rank 0 feeds a separately optimised head on rank 1 every step, trained together.
"""

from __future__ import annotations

import dataclasses

from torch import nn

from bench.core.memory import Terms
from bench.core.mesh import Mesh
from bench.core.spec import CellSpec
from bench.workloads import Workload
from strategies import catalog
from strategies.base import Context, OneProcessMultiGPU, Step, Strategy, common_check
from strategies.common import P2P, build_for_sharding, materialize, param_costs, partition, stage_modules
from strategies.memory import block_elements, cut_terms, layout
from strategies.training import compile_blocks, make_optimizer, prepare_blocks


class Chain(Strategy):
    declared = catalog.CHAIN

    def check(self, cell: CellSpec, *, gpus: int) -> str | None:
        r = common_check(cell, gpus=gpus, min_world=self.min_world)
        if r is None and cell.workload.n_blocks < cell.n_devices:
            r = f"{cell.workload.n_blocks} blocks cannot fill {cell.n_devices} ranks"
        return r

    def label_values(self, cell: CellSpec) -> dict:
        return {"mesh": Mesh.line("chain", cell.n_devices).label}

    def stages(self, wl: Workload, model: nn.Module, world: int) -> list[nn.Module]:
        return stage_modules(wl, model, world)

    def bounds(self, n_blocks: int, elements: list[int], world: int) -> list[tuple[int, int]]:
        """The block ranges :meth:`stages` gives each rank: ``stage_modules``' cut, balancing
        parameter counts."""
        return partition(param_costs(elements), world)

    def memory_terms(self, cell: CellSpec) -> Terms:
        """Each rank's blocks (strategies.memory.cut_terms), cut as :meth:`stages` cuts them; every
        rank runs the whole global batch at once, receiving its input and its output's gradient
        into one buffer each. Without the planner's layout: 1/n of everything, approximate."""
        base = super().memory_terms(cell)
        ps = layout(cell.workload)
        if ps is None:
            return dataclasses.replace(base, micro_batch=cell.workload.global_batch, how="approximate")
        n = cell.workload.n_blocks
        ranks = [[b] for b in self.bounds(n, block_elements(ps, n), cell.n_devices)]
        return cut_terms(cell.workload, ps, ranks, micro_batch=cell.workload.global_batch, in_flight=1,
                         messages=1, communicators=base.communicators)

    def prepare(self, wl: Workload, ctx: Context) -> Step:
        r, w = ctx.rank, ctx.world_size
        model = build_for_sharding(wl, ctx)
        prepare_blocks(wl, model, ctx, compile_each=False)
        mine = self.stages(wl, model, w)[r]
        materialize(wl, model, [(mine, ctx.device)])  # this rank's blocks only
        compile_blocks([mine], ctx)  # per stage
        del model
        opt = make_optimizer(mine.parameters(), ctx)
        p2p = P2P(ctx)
        first, last = r == 0, r == w - 1
        shapes: dict[str, tuple] = {}

        def run(batch):
            x, y = ctx.to_device(batch)
            if first:
                inp = x
            else:
                if "in" not in shapes:
                    shapes["in"] = p2p.recv_meta(r - 1)
                inp = p2p.recv(*shapes["in"], r - 1).requires_grad_()
            with ctx.autocast():
                out = mine(inp)
            if last:
                loss = wl.loss(out, y)
                loss.backward()
            else:
                if "out" not in shapes:
                    p2p.send_meta(out, r + 1)
                    shapes["out"] = (out.shape, out.dtype)
                p2p.send(out, r + 1)
                grad = p2p.recv(out.shape, out.dtype, r + 1)
                out.backward(grad)
            if not first:
                p2p.send(inp.grad, r - 1)
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss.detach() if last else None

        return Step(run=run, loss_weight=1.0 if last else 0.0, optimizer=opt)


class EncoderHead(Chain):
    declared = catalog.ENCODER_HEAD


    def check(self, cell: CellSpec, *, gpus: int) -> str | None:
        if cell.n_devices != 2:
            return "encoder-head runs on exactly 2 ranks (encoder, head)"
        return super().check(cell, gpus=gpus)

    def stages(self, wl: Workload, model: nn.Module, world: int) -> list[nn.Module]:
        blocks = wl.blocks(model)
        return [nn.Sequential(*blocks[:-1]), nn.Sequential(blocks[-1])]

    def bounds(self, n_blocks: int, elements: list[int], world: int) -> list[tuple[int, int]]:
        """The encoder (every block but the last) and the head (the last), as :meth:`stages`."""
        return [(0, n_blocks - 1), (n_blocks - 1, n_blocks)]


class LayerSplit(OneProcessMultiGPU):
    declared = catalog.LAYERSPLIT
    cpu_reason = "layer split places blocks on several GPUs; on CPU there is one device"

    def check(self, cell: CellSpec, *, gpus: int) -> str | None:
        reason = super().check(cell, gpus=gpus)
        if reason is None and cell.workload.n_blocks < cell.n_devices:
            reason = f"{cell.workload.n_blocks} blocks cannot fill {cell.n_devices} GPUs"
        return reason

    def label_values(self, cell: CellSpec) -> dict:
        return {"mesh": Mesh.line("split", cell.n_devices).label}

    def prepare(self, wl: Workload, ctx: Context) -> Step:
        devices = list(ctx.devices)
        whole = build_for_sharding(wl, ctx)
        prepare_blocks(wl, whole, ctx, compile_each=False)
        parts = stage_modules(wl, whole, len(devices))
        materialize(wl, whole, list(zip(parts, devices)))  # each part straight onto its device
        for part, dev in zip(parts, devices):
            part.to(dev)
        compile_blocks(parts, ctx)  # per stage
        del whole
        model = nn.ModuleList(parts)
        opt = make_optimizer(model.parameters(), ctx)

        def run(batch):
            x, y = batch
            h = x.to(devices[0])
            with ctx.autocast():
                for part, dev in zip(parts, devices):
                    h = part(h.to(dev))
            loss = wl.loss(h, y.to(devices[-1]))
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss.detach()

        return Step(run=run, loss_weight=1.0, optimizer=opt)
