"""A plain torchrun training loop, written the way people write it, outside the harness.

It trains the same model on the same batches as parbench, so the harness's step time can be
checked against it:

    torchrun --nproc-per-node 2 -m bench.baselines.plain_ddp --workload gpt-200m --steps 30 --warmup 5
    python -m bench.baselines.plain_ddp --workload gpt-200m --no-ddp          # plain single GPU

Prints one JSON line: mean step time over the timed steps (synchronize, perf_counter, N steps,
synchronize), the world size and the final loss.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from bench.workloads import resolve


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", default="gpt-200m")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--backend", default="nccl")
    ap.add_argument("--lr", type=float, default=1e-2)
    ap.add_argument("--no-ddp", action="store_true", help="one GPU, no process group")
    args = ap.parse_args()

    ddp = not args.no_ddp
    if ddp:
        local = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(local)
        dist.init_process_group(args.backend, device_id=torch.device("cuda", local)
                                if args.backend == "nccl" else None)
        rank, world = dist.get_rank(), dist.get_world_size()
    else:
        local, rank, world = 0, 0, 1
    dev = torch.device("cuda", local)
    torch.backends.cuda.matmul.allow_tf32 = False
    wl = resolve(args.workload)
    model = wl.build(dev)
    net = DDP(model, device_ids=[local]) if ddp else model
    opt = torch.optim.SGD(net.parameters(), lr=args.lr)
    per = wl.global_batch // world
    batches = []
    for s in range(args.warmup + args.steps):
        x, y = wl.batch(s)
        batches.append((x[rank * per:(rank + 1) * per].to(dev), y[rank * per:(rank + 1) * per].to(dev)))

    def step(x, y):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = net(x)
        loss = wl.loss(out, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    for x, y in batches[: args.warmup]:
        step(x, y)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for x, y in batches[args.warmup:]:
        loss = step(x, y)
    torch.cuda.synchronize()
    mean = (time.perf_counter() - t0) / args.steps
    if ddp:
        dist.all_reduce(loss)
        loss /= world
    if rank == 0:
        print(json.dumps({"baseline": "plain-ddp" if ddp else "plain-single",
                          "backend": args.backend if ddp else "none", "workload": wl.name, "world_size": world,
                          "step_time_mean_s": mean,
                          "loss_final": float(loss), "gpu": torch.cuda.get_device_name(dev)}), flush=True)
    if ddp:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
