"""Does a torch.profiler session leave a cost behind in its process?

The harness profiles each cell's first repeat (``--profile-steps``, default 2 steps with GPU
activity; with 0, one step with CPU activity only) in the same rank processes that measure the
group's other cells: with ``--profile-at inline`` right after that repeat, with ``end`` (the CUDA
default) in a pass after every timed step. The plain reference programs never profile. If the
profiler (Kineto, CUPTI) stays attached after its session, later launch-bound steps pay for it, and
only on the harness side.

This runs one launch-bound loop (many small kernels: the regime of FSDP2, pipelines and tensor
parallelism on a slow host) on one device in three phases, one after the other (a profiler session
cannot be undone, so they cannot interleave): ``before`` (never profiled), ``after-cpu`` (after a
CPU-only session, as the harness's evidence step with ``--profile-steps 0``), ``after-cuda`` (after a session with
CUDA activity). Each phase is ``--blocks`` blocks timed with device events around ``--iters``
iterations; the median over blocks per phase is printed with the ratio to ``before`` and the
block range (a ratio inside the ranges is drift, not an effect). One JSON line last.

    python3 -m tools.baselines.profiler_aftereffect [--device cuda] [--blocks 7]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch


def make_step(device: torch.device, width: int, depth: int):
    layers = [torch.nn.Linear(width, width, device=device) for _ in range(depth)]

    def step() -> None:
        x = torch.randn(8, width, device=device, requires_grad=True)
        y = x
        for lin in layers:
            y = torch.nn.functional.gelu(lin(y)) + y
        y.sum().backward()
        for lin in layers:
            lin.weight.grad = None
            lin.bias.grad = None

    return step


def block(step, device: torch.device, iters: int) -> float:
    """Seconds per iteration over ``iters`` back-to-back iterations."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(iters):
            step()
        b.record()
        torch.cuda.synchronize(device)
        return a.elapsed_time(b) / 1e3 / iters
    t = time.perf_counter()
    for _ in range(iters):
        step()
    return (time.perf_counter() - t) / iters


def session(step, activities) -> None:
    from torch.profiler import profile, record_function

    with profile(activities=activities, record_shapes=True) as prof:
        with record_function("parbench_step"):
            step()
    import tempfile

    with tempfile.NamedTemporaryFile(suffix=".json") as f:  # as the harness does: export the trace
        prof.export_chrome_trace(f.name)


def main(argv: list[str] | None = None) -> int:
    from torch.profiler import ProfilerActivity

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--blocks", type=int, default=7, help="timed blocks per phase")
    ap.add_argument("--iters", type=int, default=30, help="iterations per block")
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--depth", type=int, default=48)
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    step = make_step(device, args.width, args.depth)
    for _ in range(20):
        step()
    out: dict[str, list[float]] = {"before": [block(step, device, args.iters) for _ in range(args.blocks)]}
    session(step, [ProfilerActivity.CPU])
    out["after-cpu"] = [block(step, device, args.iters) for _ in range(args.blocks)]
    if device.type == "cuda":
        session(step, [ProfilerActivity.CPU, ProfilerActivity.CUDA])
        out["after-cuda"] = [block(step, device, args.iters) for _ in range(args.blocks)]
    base = statistics.median(out["before"])
    for k, v in out.items():
        med = statistics.median(v)
        print(f"{k:10s} median {med * 1e3:8.3f} ms/iter  range [{min(v) * 1e3:.3f}, {max(v) * 1e3:.3f}]  "
              f"ratio to before {med / base:.3f}")
    print(json.dumps({"probe": "profiler_aftereffect", "device": str(device),
                      "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                      "torch": torch.__version__, "per_iter_s": out}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
