"""What recording GPU activity does to a plain FSDP2 step, over several GPUs.

The harness's breakdown comes from steps profiled with GPU activity only (torch.profiler, CUPTI);
a breakdown describes the timed step only if profiling leaves the step as it was. This builds the
plain FSDP2 loop (``tools.baselines.plain_fsdp``: its flags apply) and times it in interleaved
blocks, one block a phase a round: ``plain`` (no profiler), ``cuda`` (inside a profiler window
recording GPU activity, after one discarded step, as the harness's timing pass) and
``cuda-noext`` (the same with ``disable_external_correlation``: no correlation id pushed per
operator). Each step is timed with CUDA events at its boundaries, the slowest rank's time kept.
Rank 0 prints, per phase, the median step and its range over blocks and the ratio to ``plain``;
one JSON line last.

    torchrun --nproc-per-node 4 -m tools.baselines.profiler_step_cost --blocks 5 --steps 10
"""

from __future__ import annotations

import contextlib
import json
import statistics

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, _ExperimentalConfig, profile, schedule

from tools.baselines import _common as c
from tools.baselines import plain_fsdp

PHASES = ("plain", "cuda", "cuda-noext")


def session(phase: str, steps: int):
    """The profiler window of ``phase`` (none for plain): one warm-up step, then ``steps`` active."""
    if phase == "plain":
        return contextlib.nullcontext()
    extra = _ExperimentalConfig(disable_external_correlation=phase == "cuda-noext")
    return profile(activities=[ProfilerActivity.CUDA], schedule=schedule(wait=0, warmup=1, active=steps),
                   experimental_config=extra)


def block(step, phase: str, first: int, steps: int, env: c.Env) -> list[float]:
    """``steps`` timed steps of ``phase`` (after one untimed step inside the same window): seconds
    per step, the slowest rank's."""
    torch.cuda.synchronize()
    dist.barrier()
    with session(phase, steps) as prof:
        step(first)
        if prof is not None:
            prof.step()
        clock = c.Clock(env.device)
        clock.mark()
        for i in range(steps):
            step(first + 1 + i)
            clock.mark()
            if prof is not None:
                prof.step()
        times = clock.seconds()
    t = torch.tensor(times, dtype=torch.float64, device=env.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def main() -> None:
    ap = c.parser(__doc__.splitlines()[0])
    plain_fsdp.add_flags(ap)
    ap.add_argument("--blocks", type=int, default=5, help="rounds; each runs one block of every phase")
    args = ap.parse_args()
    args.steps = max(args.steps, 2)
    env, wl = c.setup(args)
    step, settings = plain_fsdp.build(args, env, wl)
    for i in range(args.warmup):
        step(i)
    medians: dict[str, list[float]] = {p: [] for p in PHASES}
    for r in range(args.blocks):
        order = PHASES if r % 2 == 0 else PHASES[::-1]
        for phase in order:
            medians[phase].append(statistics.median(block(step, phase, r, args.steps, env)))
    if env.rank == 0:
        base = statistics.median(medians["plain"])
        print(f"{'phase':<11} {'ms/step':>8} {'range over blocks':>20} {'vs plain':>9}")
        for phase, vals in medians.items():
            m = statistics.median(vals)
            span = f"[{1e3 * min(vals):.1f}, {1e3 * max(vals):.1f}]"
            print(f"{phase:<11} {1e3 * m:>8.1f} {span:>20} {m / base:>9.3f}")
        print(json.dumps({"tool": "profiler_step_cost", "workload": wl.name, "world_size": env.world,
                          "gpu": torch.cuda.get_device_name(env.device), "torch": torch.__version__,
                          "blocks": args.blocks, "steps": args.steps, "optimizer": args.optimizer,
                          "compile": args.compile, "ac": args.ac, **settings,
                          "block_medians_s": medians}), flush=True)
    c.teardown(env)


if __name__ == "__main__":
    main()
