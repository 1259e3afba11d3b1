"""What recording GPU activity costs each kernel launch, on one device.

The breakdown's profiled steps record GPU activity only (CUPTI through torch.profiler); a step
whose GPU waits on the host (FSDP2's per-layer hooks, DataParallel's threads) stretches by what
each launch then costs. This launches ``--launches`` tiny kernels back to back (a launch-bound
loop: the host time is the launch cost) in interleaved blocks: ``plain`` (no profiler), ``cuda``
(inside an active profiler window recording GPU activity only) and ``cuda+cpu`` (host events too),
and prints the microseconds per launch of each (median and range over blocks) and the added cost.
One JSON line last.

    python3 -m tools.baselines.profiler_launch_cost [--blocks 5] [--launches 20000]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from torch.profiler import ProfilerActivity, profile


def launches(x: torch.Tensor, n: int) -> float:
    """Host seconds per launch of ``n`` in-place adds (device drained before and after)."""
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        x.add_(1.0)
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", type=int, default=5)
    ap.add_argument("--launches", type=int, default=20000)
    a = ap.parse_args()
    x = torch.zeros(16, device="cuda")
    launches(x, 1000)  # warm
    kinds = {"plain": None, "cuda": [ProfilerActivity.CUDA], "cuda+cpu": [ProfilerActivity.CPU, ProfilerActivity.CUDA]}
    out: dict[str, list[float]] = {k: [] for k in kinds}
    for _ in range(a.blocks):
        for kind, acts in kinds.items():
            if acts is None:
                out[kind].append(launches(x, a.launches))
            else:
                with profile(activities=acts):
                    launches(x, 200)  # the session's own start-up
                    out[kind].append(launches(x, a.launches))
    us = {k: [1e6 * v for v in vals] for k, vals in out.items()}
    base = statistics.median(us["plain"])
    print(f"{'phase':<10} {'us/launch':>10} {'range':>16} {'added':>8}")
    for k, vals in us.items():
        m = statistics.median(vals)
        print(f"{k:<10} {m:>10.2f} {f'[{min(vals):.2f}, {max(vals):.2f}]':>16} {m - base:>+8.2f}")
    print(json.dumps({"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "blocks": a.blocks,
                      "launches": a.launches, "us_per_launch": {k: statistics.median(v) for k, v in us.items()},
                      "ranges": {k: [min(v), max(v)] for k, v in us.items()}}))


if __name__ == "__main__":
    main()
