"""Strategies that misbehave on purpose, to prove the harness notices (loaded as tests.helpers:X)."""

from __future__ import annotations

import time

import torch.distributed as dist

from bench.workloads import Workload
from strategies.base import Context, Step, Strategy, local_share, make_optimizer, train_step


class NoAverage(Strategy):
    """Data parallel that sums gradients but forgets to divide by the world size: it trains a
    different model than single device, and parity must say so."""

    name = "test-noaverage"
    summary = needs = "test only"

    def prepare(self, wl: Workload, ctx: Context) -> Step:
        model = wl.build(ctx.device)
        opt = make_optimizer(model.parameters(), ctx)

        def hook():
            for p in model.parameters():
                dist.all_reduce(p.grad)

        return Step(run=lambda b: train_step(model, wl, ctx, opt, local_share(b, ctx), after_backward=hook),
                    loss_weight=1.0 / ctx.world_size)


class Raises(Strategy):
    name = "test-raises"
    summary = needs = "test only"

    def prepare(self, wl: Workload, ctx: Context) -> Step:
        raise RuntimeError("deliberate failure in prepare")


class Hangs(Strategy):
    name = "test-hangs"
    summary = needs = "test only"

    def prepare(self, wl: Workload, ctx: Context) -> Step:
        time.sleep(3600)
        raise AssertionError("unreachable")
