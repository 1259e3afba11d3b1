"""Estimates for a machine of one GPU: what 2, 4 and 8 GPUs of its kind would give the best
configuration it measured, under DDP and FSDP, from the communication a step of each needs and the
bus bandwidth of an NVLink all-reduce. Estimates, never measurements: each says what it assumes.

Each GPU keeps the best configuration's batch per device (the global batch grows with the GPUs, as a
user with n GPUs would run it), so a step computes what the measured step computed; on top comes the
communication a step needs, somewhere between hidden behind the backward pass (the fast end) and not
hidden at all (the slow end):

* DDP all-reduces the gradients (fp32, 4 bytes a trainable parameter, in 25 MiB buckets): a ring moves
  2(n-1)/n of them through each GPU;
* FSDP2 all-gathers the bf16 parameters twice (forward and backward) and reduce-scatters the fp32
  gradients: (2 + 2 + 4)(n-1)/n bytes a parameter; it also holds 1/n of the parameters, gradients and
  AdamW state on each GPU.

The bandwidth is a measured figure: all_reduce through a torch loop on 4x H200 with NVLink (NV18),
252 GB/s bus bandwidth at 16 MiB and 334 at 256 MiB (2026-11-26, torch 2.11); a 25 MiB bucket runs
near the first. Another interconnect (PCIe, several nodes) is slower: the estimate says so, and
``parbench comm`` measures the curve of the machine at hand.
"""

from __future__ import annotations

from dataclasses import dataclass

#: all_reduce bus bandwidth (bytes/s) of the buckets DDP sends, and of the whole-model collectives
#: FSDP2 sends per block, on 4x H200 NV18 (see the module's text)
BUCKET_BUSBW, BLOCK_BUSBW = 252e9, 334e9
#: the world sizes a one-GPU run is given estimates for
WORLD_SIZES = (2, 4, 8)
ASSUMES = ("NVLink between the GPUs at the all_reduce bus bandwidth measured on 4x H200 NV18 (252 GB/s for DDP's "
           "25 MiB buckets, 334 GB/s for FSDP's per-block collectives), the best configuration's batch per GPU "
           "kept (the global batch grows with the GPUs), communication between fully hidden and fully exposed, "
           "and nothing else: the wrapper's own costs (hooks, bucket copies, a slow rank) come on top; PCIe or "
           "several nodes are slower (measure yours: parbench comm)")


@dataclass(frozen=True)
class Estimate:
    """An estimated step at ``world_size`` GPUs: its range in ms and the speed-up range over the one
    GPU measured (throughput, samples a second), and the communication it rests on."""

    strategy: str
    world_size: int
    step_ms: tuple[float, float]
    speedup: tuple[float, float]
    comm_ms: float


def comm_s(strategy: str, params: float, n: int) -> float:
    """Seconds of communication a step of ``strategy`` needs at ``n`` GPUs for ``params`` trainable
    parameters, at the assumed bus bandwidths."""
    if strategy == "ddp":
        return 4 * params * 2 * (n - 1) / n / BUCKET_BUSBW
    if strategy == "fsdp":
        return 8 * params * (n - 1) / n / BLOCK_BUSBW
    raise ValueError(f"no estimate for {strategy!r}")


def estimate(step_s: float, params: float, world_sizes: tuple[int, ...] = WORLD_SIZES) -> list[Estimate]:
    """DDP's and FSDP2's estimates at each world size for a measured one-GPU step of ``step_s``
    seconds and ``params`` trainable parameters."""
    if not step_s or step_s <= 0 or not params or params <= 0:
        return []
    out = []
    for strategy in ("ddp", "fsdp"):
        for n in world_sizes:
            c = comm_s(strategy, params, n)
            lo, hi = step_s, step_s + c
            out.append(Estimate(strategy=strategy, world_size=n, step_ms=(lo * 1e3, hi * 1e3),
                                speedup=(n * step_s / hi, n * step_s / lo), comm_ms=c * 1e3))
    return out


def line(estimates: list[Estimate]) -> str:
    """'ddp x2 1.96-2.00x, x4 ...; fsdp x2 ...' (speed-ups over the one GPU measured)."""
    parts = []
    for strategy in dict.fromkeys(e.strategy for e in estimates):
        mine = [e for e in estimates if e.strategy == strategy]
        parts.append(f"{strategy} " + ", ".join(f"x{e.world_size} {e.speedup[0]:.2f}-{e.speedup[1]:.2f}x"
                                                for e in mine))
    return "; ".join(parts)
