"""A plain MLP regression workload: the smallest thing that still has several layers to split."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from bench.workloads.base import Workload, build_on, seeded


class Layer(nn.Sequential):
    def __init__(self, d_in: int, d_out: int):
        super().__init__(nn.Linear(d_in, d_out), nn.ReLU())


def make(*, seed: int = 0, d_in: int = 256, width: int = 512, depth: int = 4, d_out: int = 16,
         global_batch: int = 64) -> Workload:
    """An MLP of ``depth`` hidden layers of ``width``; MSE against a fixed random target."""
    dims = [d_in] + [width] * depth

    def ctor() -> nn.Module:
        return nn.Sequential(*[Layer(a, b) for a, b in zip(dims[:-1], dims[1:])], nn.Linear(width, d_out))

    def batch(step: int):
        g = seeded(seed, step)
        return torch.randn(global_batch, d_in, generator=g), torch.randn(global_batch, d_out, generator=g)

    def loss(out: Tensor, target: Tensor) -> Tensor:
        return F.mse_loss(out.float(), target)

    macs = sum(a * b for a, b in zip(dims[:-1], dims[1:])) + width * d_out
    params = macs + sum(dims[1:]) + d_out
    return Workload(
        name="mlp", build=lambda device: build_on(device, seed, ctor), batch=batch, loss=loss,
        global_batch=global_batch, flops_per_sample=6.0 * macs, n_blocks=depth + 1, params=params,
        description=f"MLP {d_in}->{width}x{depth}->{d_out}, {params / 1e6:.2f}M params",
    )
