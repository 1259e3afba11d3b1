"""Plumbing shared by the plain reference programs, and by nothing else.

The plain programs (``plain_ddp``, ``plain_fsdp``, ``plain_pipeline``, ``plain_tp``) share only the
workload with the harness (``bench.workloads``); this module holds what they share among
themselves: the command-line flags, environment-driven setup (torchrun sets RANK, LOCAL_RANK and
WORLD_SIZE), the timed loop, and the one JSON line each prints. Nothing here imports
``bench.train.launcher``, ``bench.train.worker``, ``bench.measure.timing`` or ``strategies``.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import Tensor

from bench.workloads import Workload, resolve

LR = 1e-2  # the harness's SGD learning rate, so that losses compare


@dataclass(frozen=True)
class Env:
    """Where this process runs: its rank in the group and its device."""

    rank: int
    world: int
    local_rank: int
    device: torch.device
    backend: str
    distributed: bool  # False only for a one-process run without a process group


def parser(description: str) -> argparse.ArgumentParser:
    """The flags every plain program takes; each program adds its own."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--workload", default="gpt-200m", help="a built-in workload name (bench.workloads)")
    ap.add_argument("--dims", action="append", default=[], metavar="K=V[,K=V]",
                    help="workload dimensions, e.g. n_layer=6 (passed to resolve)")
    ap.add_argument("--global-batch", type=int, default=None, metavar="N",
                    help="override the workload's global batch (as the harness's --global-batch; strong "
                         "scaling: the same N at every world size)")
    ap.add_argument("--steps", type=int, default=30, help="timed steps")
    ap.add_argument("--warmup", type=int, default=5, help="untimed steps before the timed ones")
    ap.add_argument("--backend", default=None, help="nccl or gloo (default: nccl on cuda, gloo on cpu)")
    ap.add_argument("--device", choices=("cpu", "cuda"), default=None,
                    help="default: cuda when a GPU is visible")
    ap.add_argument("--precision", choices=("auto", "bf16", "fp32"), default="auto",
                    help="auto: bf16 autocast on cuda, fp32 on cpu (as the harness)")
    ap.add_argument("--lr", type=float, default=LR)
    return ap


def parse_dims(items: list[str]) -> dict[str, int]:
    """``["n_layer=6,d_model=128"]`` -> ``{"n_layer": 6, "d_model": 128}``."""
    out: dict[str, int] = {}
    for item in items:
        for kv in filter(None, item.split(",")):
            k, sep, v = kv.partition("=")
            if not sep:
                raise SystemExit(f"--dims {kv!r}: expected KEY=VALUE")
            out[k.strip()] = int(v)
    return out


def setup(args: argparse.Namespace, *, distributed: bool = True) -> tuple[Env, Workload]:
    """Pick the device, start the process group from torchrun's environment, resolve the workload."""
    device_type = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    args.device = device_type
    args.backend = args.backend or ("nccl" if device_type == "cuda" else "gloo")
    if args.precision == "auto":
        args.precision = "bf16" if device_type == "cuda" else "fp32"
    local = int(os.environ.get("LOCAL_RANK", 0))
    if device_type == "cuda":
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
        # fp32 runs are fp32 (no TF32), as in the harness, so fp32 losses compare to the bit budget.
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    else:
        device = torch.device("cpu")
    if distributed:
        # A timeout turns a lost message into an error instead of a hang; device_id lets NCCL
        # connect eagerly to the one GPU this rank owns.
        kw: dict = {"timeout": timedelta(seconds=300)}
        if args.backend == "nccl":
            kw["device_id"] = device
        dist.init_process_group(args.backend, **kw)
        rank, world = dist.get_rank(), dist.get_world_size()
    else:
        rank, world = 0, 1
    if args.global_batch is not None and args.global_batch < 1:
        raise SystemExit(f"--global-batch {args.global_batch} must be >= 1")
    dims = parse_dims(args.dims)
    if "global_batch" in dims:
        raise SystemExit("--dims global_batch=...: give the global batch as --global-batch N")
    wl = resolve(args.workload, global_batch=args.global_batch, **dims)
    return Env(rank, world, local, device, args.backend if distributed else "none", distributed), wl


def autocast(env: Env, precision: str) -> contextlib.AbstractContextManager:
    """bf16 autocast when asked (the harness's mixed precision); a no-op for fp32."""
    if precision == "bf16":
        return torch.autocast(env.device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def sgd(params: Iterator[Tensor] | list[Tensor], lr: float) -> torch.optim.Optimizer:
    """Plain SGD, as the harness. DTensor and plain parameters go in separate groups because the
    multi-tensor (foreach) update, the default on CUDA, refuses a list that mixes them."""
    from torch.distributed.tensor import DTensor

    params = list(params)
    groups = [g for g in ([p for p in params if isinstance(p, DTensor)],
                          [p for p in params if not isinstance(p, DTensor)]) if g]
    return torch.optim.SGD([{"params": g} for g in groups], lr=lr)


def batches(wl: Workload, n: int, env: Env, *, share: bool, need_x: bool = True,
            need_y: bool = True) -> list[tuple[Tensor | None, Tensor | None]]:
    """The first ``n`` global batches, moved to the device before timing starts. ``share``: this
    rank's contiguous slice (data parallel); else the whole batch (tensor parallel, pipeline)."""
    out = []
    for s in range(n):
        x, y = wl.batch(s)
        if share:
            k = x.shape[0] // env.world
            x, y = x[env.rank * k:(env.rank + 1) * k], y[env.rank * k:(env.rank + 1) * k]
        out.append((x.to(env.device) if need_x else None, y.to(env.device) if need_y else None))
    return out


class Clock:
    """Step boundaries: CUDA events on the current stream (no host sync inside the loop) or
    ``perf_counter`` on CPU. Step k lasts from boundary k to boundary k+1, so the steps tile the
    timed window with no gap."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.marks: list = []

    def mark(self) -> None:
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            self.marks.append(e)
        else:
            self.marks.append(time.perf_counter())

    def seconds(self) -> list[float]:
        if self.cuda:
            torch.cuda.synchronize()
            return [a.elapsed_time(b) / 1e3 for a, b in zip(self.marks, self.marks[1:])]
        return [b - a for a, b in zip(self.marks, self.marks[1:])]


def train(step: Callable[[int], Tensor | None], *, warmup: int, steps: int,
          env: Env) -> tuple[list[float], Tensor | None]:
    """Run ``step(i)`` for the warm-up (untimed) and timed steps; return per-step seconds (max over
    ranks: the slowest rank sets the pace) and the last step's loss as ``step`` returned it."""
    loss = None
    for i in range(warmup):
        loss = step(i)
    if env.device.type == "cuda":
        torch.cuda.synchronize()
    if env.distributed:
        dist.barrier()  # start the timed window together
    clock = Clock(env.device)
    clock.mark()
    for i in range(warmup, warmup + steps):
        loss = step(i)
        clock.mark()
    times = clock.seconds()
    if env.distributed:
        # One collective after the window, so it costs the timed steps nothing.
        t = torch.tensor(times, dtype=torch.float64,
                         device=env.device if env.backend == "nccl" else "cpu")
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        times = t.tolist()
    return times, loss


def report(name: str, args: argparse.Namespace, env: Env, wl: Workload, times: list[float],
           loss: float, **settings: object) -> None:
    """Print the one JSON line (rank 0 only)."""
    if env.rank != 0:
        return
    gpu = torch.cuda.get_device_name(env.device) if env.device.type == "cuda" else "cpu"
    row = {"baseline": name, "workload": wl.name, "world_size": env.world, "backend": env.backend,
           "device": env.device.type, "precision": args.precision, "steps": args.steps,
           "warmup": args.warmup, "global_batch": wl.global_batch, "step_time_mean_s": statistics.fmean(times),
           "step_time_median_s": statistics.median(times), "step_times_s": times,
           "loss_final": loss, "gpu": gpu, "torch": torch.__version__, **settings}
    print(json.dumps(row), flush=True)


def global_mean(loss: Tensor, env: Env) -> float:
    """Mean over ranks of per-rank mean losses: the global-batch loss when shares are equal."""
    loss = loss.detach().float().reshape(1).clone()
    if env.distributed and env.world > 1:
        dev = env.device if env.backend == "nccl" else torch.device("cpu")
        loss = loss.to(dev)
        dist.all_reduce(loss)
        loss /= env.world
    return float(loss)


def teardown(env: Env) -> None:
    """Destroy the group, then collect: gloo's worker thread can abort the process at exit when
    its work objects are freed during interpreter finalisation."""
    if env.distributed:
        dist.destroy_process_group()
    gc.collect()
