"""A model built for sharding on real gloo ranks: the strategies that cut a model build it on the
meta device, and each rank allocates and initialises only its part, which equals that part of the
model one device builds (so a model larger than one device fits, and parity still holds)."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from bench.runtime.process import free_port


def _context(rank: int, world: int, **options):
    from bench.core.knobs import Training
    from strategies.base import Context

    return Context(rank=rank, world_size=world, local_rank=rank, device=torch.device("cpu"),
                   devices=(torch.device("cpu"),), backend="gloo", seed=0, precision="fp32",
                   training=Training(optimizer="sgd", lr=1e-2),
                   options=options)


def _check(rank: int, world: int, port: int) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor

    import strategies
    from bench.workloads import resolve
    from strategies.common import build_for_sharding, materialize, stage_modules
    from strategies.fsdp import shard_model
    from strategies.tensor import apply_tp

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))
    try:
        wl = resolve("gpt-tiny", seed=0, n_layer=4)
        ref = dict(wl.build(torch.device("cpu")).named_parameters())
        total = sum(p.numel() for p in ref.values())
        ctx = _context(rank, world, tp_plan="sp")
        mesh = init_device_mesh("cpu", (world,))

        def agree(model, *, sharded: bool) -> int:
            """Every placed parameter equals one device's; returns the elements this rank holds."""
            held = 0
            for name, p in model.named_parameters():
                if p.device.type == "meta":
                    continue
                full = p.full_tensor() if isinstance(p, DTensor) else p
                assert torch.equal(full.detach(), ref[name].detach()), name
                held += (p.to_local() if isinstance(p, DTensor) else p).numel()
            return held

        fsdp = build_for_sharding(wl, ctx)
        assert all(p.device.type == "meta" for p in fsdp.parameters())
        shard_model(wl, fsdp, mesh, reshard=True)
        materialize(wl, fsdp, [(fsdp, ctx.device)])
        held = agree(fsdp, sharded=True)
        assert held <= total / world + 4 * len(ref), (held, total)  # each rank about 1/world (+ padding)

        tp = build_for_sharding(wl, ctx)
        apply_tp(wl, tp, mesh, ctx)
        materialize(wl, tp, [(tp, ctx.device)])
        assert agree(tp, sharded=True) < total

        whole = build_for_sharding(wl, ctx)
        stages = stage_modules(wl, whole, world)
        materialize(wl, whole, [(stages[rank], ctx.device)])
        held = agree(whole, sharded=False)
        assert held == sum(p.numel() for p in stages[rank].parameters()) < total
        # The other ranks' stages were never allocated here.
        others = [p for k, s in enumerate(stages) if k != rank for p in s.parameters()]
        assert others and all(p.device.type == "meta" for p in others)

        # The strategies themselves build the model on the meta device only.
        seen: list[str] = []
        spy = dataclasses.replace(wl, build=lambda device: (seen.append(device.type), wl.build(device))[1])
        for name, opts in (("fsdp", {}), ("tensor", {"tp_plan": "sp"}), ("pipeline-1f1b", {}), ("chain", {})):
            strat = strategies.get(name)
            options = strat.resolve_options(world, opts)
            options.setdefault("micro_batches", world)
            seen.clear()
            step = strat.prepare(spy, _context(rank, world, **options))
            assert seen == ["meta"], (name, seen)
            step.run(wl.batch(0))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world", [2, pytest.param(4, marks=pytest.mark.long)])
def test_sharding_strategies_allocate_only_their_part(world):
    port = free_port()
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_check, args=(r, world, port)) for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=240)
    stuck = [p.pid for p in procs if p.is_alive()]
    for p in procs:
        if p.is_alive():
            p.kill()
    assert not stuck, f"ranks {stuck} did not finish"
    assert [p.exitcode for p in procs] == [0] * world
