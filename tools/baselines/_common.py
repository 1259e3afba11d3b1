"""Plumbing shared by the plain reference programs, and by nothing else.

The plain programs (``plain_ddp``, ``plain_fsdp``, ``plain_pipeline``, ``plain_tp``) share only the
workload with the harness (``bench.workloads``); this module holds what they share among
themselves: the command-line flags, environment-driven setup (torchrun sets RANK, LOCAL_RANK and
WORLD_SIZE), the optimizer, activation checkpointing of the transformer blocks, the timed loop, and
the one JSON line each prints. Nothing here imports ``bench.train.launcher``, ``bench.train.worker``,
``bench.measure.timing`` or ``strategies``: the knobs are written the way the PyTorch docs and
torchtitan write them, independently of the harness's implementation of the same knobs.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import json
import os
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import NamedTuple

import torch
import torch.distributed as dist
from torch import Tensor, nn

from bench.workloads import Workload, resolve
from tools.baselines import knobs

LR = knobs.DEFAULT_LR["sgd"]  # the harness's SGD learning rate, so that losses compare


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
    ap.add_argument("--lr", type=float, default=None,
                    help="default: 1e-2 for SGD, 3e-4 for Adam and AdamW (as the harness)")
    return ap


def add_training_flags(ap: argparse.ArgumentParser) -> None:
    """The harness's training knobs, for the programs that implement them (plain_ddp, plain_fsdp);
    the others train with SGD, eager, no checkpointing."""
    ap.add_argument("--optimizer", choices=knobs.OPTIMIZERS, default=knobs.DEFAULT_OPTIMIZER,
                    help="AdamW and Adam fused on CUDA, torch's defaults otherwise (default: adamw, as the harness)")
    ap.add_argument("--compile", action="store_true",
                    help="torch.compile: the whole model (one device, DDP) or each transformer block (FSDP2); "
                         "the compiling steps run in an extended untimed warm-up")
    ap.add_argument("--ac", choices=knobs.AC_MODES, default="none",
                    help="activation checkpointing per transformer block: full, or selective (matmuls and "
                         "attention saved, the rest recomputed)")


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
    # Programs without the knob flags train with SGD, eager, no checkpointing.
    args.optimizer = getattr(args, "optimizer", "sgd")
    args.compile = getattr(args, "compile", False)
    args.ac = getattr(args, "ac", "none")
    if args.lr is None:
        args.lr = knobs.default_lr(args.optimizer)
    args.warmup_requested = args.warmup
    args.warmup = knobs.warmup_steps(args.warmup, args.compile)
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
    if getattr(args, "compile", False):  # the loss compiled beside the model, as torchtitan does
        wl = dataclasses.replace(wl, loss=torch.compile(wl.loss))
    return Env(rank, world, local, device, args.backend if distributed else "none", distributed), wl


def autocast(env: Env, precision: str) -> contextlib.AbstractContextManager:
    """bf16 autocast when asked (the harness's mixed precision); a no-op for fp32."""
    if precision == "bf16":
        return torch.autocast(env.device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def optimizer(params: Iterator[Tensor] | list[Tensor], name: str, lr: float,
              device: torch.device) -> torch.optim.Optimizer:
    """``sgd`` (no momentum, as the harness), ``adam`` or ``adamw`` with torch's default betas, eps
    and weight decay; Adam and AdamW fused (one kernel for the whole update) on CUDA, as torchtitan
    builds them, and torch's default implementation (foreach) elsewhere. Over FSDP2's DTensor
    parameters each rank updates its shards, so the optimizer state is sharded too. DTensor and
    plain parameters go in separate groups because the multi-tensor (foreach) update refuses a
    list that mixes them."""
    from torch.distributed.tensor import DTensor

    params = list(params)
    groups = [{"params": g} for g in ([p for p in params if isinstance(p, DTensor)],
                                      [p for p in params if not isinstance(p, DTensor)]) if g]
    if name == "sgd":
        return torch.optim.SGD(groups, lr=lr)
    cls = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW}[name]
    return cls(groups, lr=lr, fused=True if device.type == "cuda" else None)


def sgd(params: Iterator[Tensor] | list[Tensor], lr: float) -> torch.optim.Optimizer:
    """Plain SGD, as the harness (the programs without the knob flags)."""
    return optimizer(params, "sgd", lr, torch.device("cpu"))


def transformer_blocks(wl: Workload, model: nn.Module) -> list[nn.Module]:
    """The transformer blocks: the workload's pieces (``wl.blocks``) but the first and last (for
    the built-in GPT: the embedding and the head), those with parameters."""
    return [b for b in wl.blocks(model)[1:-1] if any(True for _ in b.parameters())]


def _sac_policy():
    """Op-level selective checkpointing (torchtitan's ``_apply_op_sac`` without its every-other-mm
    refinement): keep the outputs of matrix products and attention, whose recomputation costs the
    most FLOPs per byte saved; recompute everything else (norms, activations, adds)."""
    from torch.utils.checkpoint import CheckpointPolicy

    aten = torch.ops.aten
    names = ("mm", "addmm", "bmm", "_scaled_dot_product_flash_attention",
             "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention")
    save = {getattr(aten, n).default for n in names if hasattr(aten, n)}  # the cuDNN one is recent

    def policy(ctx, func, *args, **kwargs):
        return CheckpointPolicy.MUST_SAVE if func in save else CheckpointPolicy.PREFER_RECOMPUTE

    return policy


def apply_ac(model: nn.Module, wl: Workload, mode: str) -> int:
    """Activation checkpointing of every transformer block, in place, as torchtitan's ``apply_ac``:
    each block replaced by a ``checkpoint_wrapper`` (non-reentrant ``torch.utils.checkpoint``;
    ``selective``: with the context of :func:`_sac_policy`). Before compile and ``fully_shard``,
    which then apply to the wrapped blocks. Returns the number of blocks wrapped."""
    if mode == "none":
        return 0
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    kw: dict = {"preserve_rng_state": False}  # no dropout in the blocks: no RNG state to replay
    if mode == "selective":
        policy = _sac_policy()
        kw["context_fn"] = lambda: create_selective_checkpoint_contexts(policy)
    owner = {id(child): (parent, name) for parent in model.modules() for name, child in parent.named_children()}
    blocks = transformer_blocks(wl, model)
    for block in blocks:
        parent, name = owner[id(block)]
        setattr(parent, name, checkpoint_wrapper(block, **kw))
    return len(blocks)


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


class Timed(NamedTuple):
    """What :func:`train` measured."""

    times: list[float]  # seconds per timed step, the slowest rank's
    loss: Tensor | None  # the last step's loss, as ``step`` returned it
    first_step_s: float | None  # the first warm-up step (with --compile: the compilation), slowest rank
    peak_mem_bytes: int | None  # CUDA: max_memory_allocated over the timed steps, largest rank; CPU: None


def train(step: Callable[[int], Tensor | None], *, warmup: int, steps: int, env: Env) -> Timed:
    """Run ``step(i)`` for the warm-up (untimed) and timed steps. The first warm-up step is timed
    on its own (with a sync: the warm-up is untimed), the CUDA peak-memory counter reset after the
    warm-up so that the peak is the timed steps'; both and the per-step seconds are reduced over
    ranks (MAX) after the window."""
    cuda = env.device.type == "cuda"
    loss, first = None, None
    for i in range(warmup):
        t0 = time.perf_counter()
        loss = step(i)
        if i == 0:
            if cuda:
                torch.cuda.synchronize()
            first = time.perf_counter() - t0
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(env.device)
    if env.distributed:
        dist.barrier()  # start the timed window together
    clock = Clock(env.device)
    clock.mark()
    for i in range(warmup, warmup + steps):
        loss = step(i)
        clock.mark()
    times = clock.seconds()
    peak = torch.cuda.max_memory_allocated(env.device) if cuda else None
    if env.distributed:
        # One collective after the window, so it costs the timed steps nothing; -1 stands for None.
        t = torch.tensor([*times, -1.0 if first is None else first, -1.0 if peak is None else float(peak)],
                         dtype=torch.float64, device=env.device if env.backend == "nccl" else "cpu")
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        *times, first_r, peak_r = t.tolist()
        first = None if first_r < 0 else first_r
        peak = None if peak_r < 0 else int(peak_r)
    return Timed(times, loss, first, peak)


def report(name: str, args: argparse.Namespace, env: Env, wl: Workload, timed: Timed,
           loss: float, **settings: object) -> None:
    """Print the one JSON line (rank 0 only): the run, the knobs, the step times, the settings."""
    if env.rank != 0:
        return
    gpu = torch.cuda.get_device_name(env.device) if env.device.type == "cuda" else "cpu"
    times = timed.times
    row = {"baseline": name, "workload": wl.name, "world_size": env.world, "backend": env.backend,
           "device": env.device.type, "precision": args.precision, "steps": args.steps,
           "warmup": args.warmup, "warmup_requested": args.warmup_requested, "global_batch": wl.global_batch,
           "optimizer": args.optimizer, "lr": args.lr, "compile": args.compile, "ac": args.ac,
           "compile_s": timed.first_step_s if args.compile else None,
           "step_time_mean_s": statistics.fmean(times), "step_time_median_s": statistics.median(times),
           "step_times_s": times, "peak_mem_bytes": timed.peak_mem_bytes,
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
