"""One replica's request path as a plain loop, outside the serving harness: where its capacity goes.

Builds the serving model as a replica does (:class:`bench.serve.models.ServeModel`), then serves
``--requests`` single requests of ``--size-min``..``--size-max`` tokens one after another, as a
replica under round-robin does, and times each request's wall (input to device, forward, answer back
to the host) and its GPU time (CUDA events around the forward). Modes:

* ``eager``: the serving path as it is (``run_grouped`` on one request);
* ``graphs``: the same path with the forward replayed from a CUDA graph per request length
  (:class:`bench.serve.models.Graphed`, as a replica under ``--graphs auto`` runs it), captured before
  the timed requests.

A request's wall far above its GPU time says the host's launches pace it; the capacity of one
replica is then 1 / wall, and whatever slows the host (its cores, their sharing) moves it. Prints
one CSV row per mode: requests, wall and GPU ms (median, p90), capacity (req/s). Usage:

    python -m tools.serve_forward [--workload gpt-small] [--modes eager,graphs] [--requests 2000]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time

import torch

from bench.serve.models import Graphed, ServeModel, run_grouped
from bench.workloads import resolve


def measure(mode: str, args: argparse.Namespace) -> dict:
    device = torch.device("cuda")
    wl = resolve(args.workload, seed=0)
    sm = ServeModel.create(wl, task="score", gen_tokens=0, seed=0)
    fn = sm.runner(sm.build(device, torch.bfloat16))
    lengths = list(range(args.size_min, min(args.size_max, sm.max_size) + 1))
    rng = random.Random(0)
    sizes = [rng.choice(lengths) for _ in range(args.requests)]
    inputs = {n: sm.make_input(n, n) for n in lengths}
    with torch.no_grad():
        run = Graphed(fn, device) if mode == "graphs" else fn

        def answer(x):
            return run_grouped(run, [x], device, torch.bfloat16)[0]

        for n in lengths:  # every shape's first-call costs (and graph capture) before the timed requests
            answer(inputs[n])
        torch.cuda.synchronize()
        walls, gpus = [], []
        for n in sizes:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            t0 = time.perf_counter()
            a.record()
            answer(inputs[n])
            b.record()
            walls.append(time.perf_counter() - t0)
            b.synchronize()
            gpus.append(a.elapsed_time(b) / 1e3)
    q = statistics.quantiles
    wall = statistics.median(walls)
    return {"mode": mode, "pid": os.getpid(), "cpus": len(os.sched_getaffinity(0)), "requests": len(walls),
            "wall_ms": wall * 1e3, "wall_p90_ms": q(walls, n=10)[-1] * 1e3,
            "gpu_ms": statistics.median(gpus) * 1e3, "capacity_rps": 1 / wall}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.serve_forward", description=__doc__.splitlines()[0])
    p.add_argument("--workload", default="gpt-small")
    p.add_argument("--modes", default="eager,graphs")
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--size-min", type=int, default=16)
    p.add_argument("--size-max", type=int, default=96)
    p.add_argument("--header", action="store_true", help="print the CSV header first")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("serve_forward: needs a CUDA device (the question is how a GPU replica's host paces it)",
              file=sys.stderr)
        return 2
    keys = ["mode", "pid", "cpus", "requests", "wall_ms", "wall_p90_ms", "gpu_ms", "capacity_rps"]
    if args.header:
        print(",".join(keys))
    for mode in args.modes.split(","):
        r = measure(mode, args)
        print(",".join(f"{r[k]:.3f}" if isinstance(r[k], float) else str(r[k]) for k in keys), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
