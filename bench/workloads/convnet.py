"""A small VGG-style conv net on synthetic 32x32 images, 10 classes."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from bench.workloads.base import Workload, build_on, seeded


def make(*, seed: int = 0, width: int = 32, image: int = 32, classes: int = 10,
         global_batch: int = 64) -> Workload:
    """Three conv stages (width, 2*width, 4*width), each conv3x3+ReLU then 2x2 max-pool, and a
    linear classifier."""
    chans = [3, width, 2 * width, 4 * width]
    if image % 8:
        raise TypeError(f"image={image} must divide by 8 (three 2x2 pools)")

    def ctor() -> nn.Module:
        stages = [nn.Sequential(nn.Conv2d(a, b, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))
                  for a, b in zip(chans[:-1], chans[1:])]
        head = nn.Sequential(nn.Flatten(), nn.Linear(chans[-1] * (image // 8) ** 2, classes))
        return nn.Sequential(*stages, head)

    def batch(step: int):
        g = seeded(seed, step)
        x = torch.randn(global_batch, 3, image, image, generator=g)
        return x, torch.randint(0, classes, (global_batch,), generator=g)

    def loss(out: Tensor, target: Tensor) -> Tensor:
        return F.cross_entropy(out.float(), target)

    macs, side = 0, image
    for a, b in zip(chans[:-1], chans[1:]):
        macs += a * b * 9 * side * side
        side //= 2
    macs += chans[-1] * side * side * classes
    params = sum(a * b * 9 + b for a, b in zip(chans[:-1], chans[1:])) + chans[-1] * side * side * classes + classes
    return Workload(
        name="convnet", build=lambda device: build_on(device, seed, ctor), batch=batch, loss=loss,
        global_batch=global_batch, flops_per_sample=6.0 * macs, n_blocks=4, params=params,
        description=f"conv net widths {chans[1:]} on {image}x{image}, {params / 1e6:.2f}M params",
    )
