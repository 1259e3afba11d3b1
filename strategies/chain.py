"""Model parallelism across processes, by hand: consecutive blocks on consecutive ranks.

Rank r receives the activation from r-1, runs its blocks, sends the result to r+1; the last rank
computes the loss; gradients travel back the same way. No micro-batches: while one rank works the
others wait, and this strategy exists to make that cost visible next to the pipelines.

``encoder-head`` is the collaborating-models case on two ranks: an encoder (every block but the
last) on rank 0 feeds a separately optimised head on rank 1 every step, trained together.
"""

from __future__ import annotations

from torch import nn

from bench.core.spec import CellSpec
from bench.workloads import Workload
from strategies.base import MESH, Context, OneProcessMultiGPU, Step, Strategy, common_check
from strategies.common import P2P, build_for_sharding, materialize, stage_modules
from strategies.training import compile_blocks, make_optimizer, prepare_blocks


class Chain(Strategy):
    name = "chain"
    summary = "hand-written model parallel over ranks: blocking send/recv of activations and gradients"
    needs = "world size >= 2 and <= blocks; CUDA+NCCL, CUDA+Gloo (through host memory) or CPU+Gloo"
    min_world = 2
    labels = (MESH,)
    distributes = ("comm",)  # activations and gradients cross ranks every step (see pipeline.py)
    cuts = True
    compiles = "each rank's stage"

    def check(self, cell: CellSpec, *, gpus: int) -> str | None:
        r = common_check(cell, gpus=gpus, min_world=self.min_world)
        if r is None and cell.workload.n_blocks < cell.n_devices:
            r = f"{cell.workload.n_blocks} blocks cannot fill {cell.n_devices} ranks"
        return r

    def label_values(self, cell: CellSpec) -> dict:
        return {"mesh": f"chain{cell.n_devices}"}

    def stages(self, wl: Workload, model: nn.Module, world: int) -> list[nn.Module]:
        return stage_modules(wl, model, world)

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
    name = "encoder-head"
    summary = "two collaborating models: encoder on rank 0 feeds its output to a head on rank 1 every step"
    needs = "world size 2; a workload with at least 2 blocks"

    # The head may be a sliver of the model (one linear layer): the evidence is the activations and
    # gradients crossing between the two models every step, not the split of the parameters.
    distributes = ("comm",)

    def check(self, cell: CellSpec, *, gpus: int) -> str | None:
        if cell.n_devices != 2:
            return "encoder-head runs on exactly 2 ranks (encoder, head)"
        return super().check(cell, gpus=gpus)

    def stages(self, wl: Workload, model: nn.Module, world: int) -> list[nn.Module]:
        blocks = wl.blocks(model)
        return [nn.Sequential(*blocks[:-1]), nn.Sequential(blocks[-1])]


class LayerSplit(OneProcessMultiGPU):
    name = "layersplit"
    summary = "naive model parallel in one process: blocks placed on several GPUs, activations .to(next)"
    needs = "CUDA; world size (GPUs used) <= visible GPUs and <= blocks; one process"
    cpu_reason = "layer split places blocks on several GPUs; on CPU there is one device"
    labels = (MESH,)
    cuts = True
    compiles = "each GPU's stage"

    def check(self, cell: CellSpec, *, gpus: int) -> str | None:
        reason = super().check(cell, gpus=gpus)
        if reason is None and cell.workload.n_blocks < cell.n_devices:
            reason = f"{cell.workload.n_blocks} blocks cannot fill {cell.n_devices} GPUs"
        return reason

    def label_values(self, cell: CellSpec) -> dict:
        return {"mesh": f"split{cell.n_devices}"}

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
