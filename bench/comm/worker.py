"""The collective sweep worker: one torchrun group times every (op, dtype, size) of a plan.

Started by :mod:`bench.comm.sweep` through the runtime's torchrun launch (``-m bench.comm.worker
PREFIX.json``, the group's :class:`bench.core.spec.CollectiveGroupSpec`); each rank inits the process
group once and runs the whole ladder; rank 0 writes the rows, each started from its point's spec
(:func:`bench.results.identity.start_row`), to the group's ``out`` (JSON, rewritten after every op
so a killed run keeps what it measured). A
rank that fails writes its error line to ``PREFIX-r<rank>.err``, where the launcher's crash reason
(:mod:`bench.runtime.crash`) finds it.

Definitions follow nccl-tests (doc/PERFORMANCE.md): ``size`` S is the total array in bytes (the
output of all_gather, the input of reduce_scatter, the send buffer of all_to_all, one rank's send
buffer for send/recv), ``algbw = S / t`` and ``busbw = algbw * factor(op, n)``.

Timing is back-to-back: warm-up calls, then ``iters`` calls between two CUDA events (NCCL) or two
``perf_counter`` reads around one synchronize (Gloo), so no per-call host sync is measured. On NCCL,
sizes up to ``graph_max_bytes`` can be captured in a CUDA graph and replayed, which removes the
Python launch cost that dominates small sizes. The time of a point is the mean over ranks (as
nccl-tests reports by default); the max over ranks is kept too.

Correctness: before timing, every op runs once on inputs filled with small integers that depend on
rank, chunk and index (exact in bf16 up to 32 ranks), and the output is compared element by element
with the expected value; ``wrong`` is the number of mismatching elements summed over ranks.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from bench.comm.ops import DTYPE_NAMES, GB, OPS, busbw_factor  # noqa: F401 - OPS: the worker's import point too
from bench.core import backends
from bench.core.spec import CollectiveGroupSpec, load
from bench.results.identity import start_row

DTYPES = dict(zip(DTYPE_NAMES, (torch.float32, torch.bfloat16)))
#: the reason recorded in the rows of send/recv under a backend without point-to-point for the
#: device's tensors (Gloo on CUDA: the sender fails with 'writev ... Bad address' and the receiver
#: waits for ever, so it is not attempted)
NO_P2P = "{backend} send/recv takes CPU tensors only (CUDA: 'writev ... Bad address', then the receiver hangs)"


def size_ladder(min_bytes: int, max_bytes: int, factor: int = 2) -> list[int]:
    """min, min*f, ... up to and including max (max is appended if the ladder misses it)."""
    out, s = [], int(min_bytes)
    while s <= max_bytes:
        out.append(s)
        s *= factor
    if out and out[-1] != max_bytes:
        out.append(int(max_bytes))
    return out


def _pattern(count: int, src: int, chunk: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Small integers (1..8) depending on source rank, chunk and index: exact in bf16, sums too."""
    base = (src % 4) + 1 + (chunk % 3)
    return (torch.arange(count, device=device, dtype=torch.int32) % 3 + base).to(dtype)


def _ranksum(n: int) -> int:
    return sum((j % 4) + 1 for j in range(n))


class Op:
    """Buffers and a call for one (op, dtype, size) on this rank, plus its correctness check."""

    def __init__(self, name: str, nbytes: int, dtype: torch.dtype, device: torch.device, rank: int, n: int):
        self.name, self.dtype, self.device, self.rank, self.n = name, dtype, device, rank, n
        esize = torch.tensor([], dtype=dtype).element_size()
        count = max(1, nbytes // esize)
        if name in ("all_gather", "reduce_scatter", "all_to_all"):
            count = max(n, count - count % n)  # the total must split evenly over ranks
        self.count, self.chunk = count, count // n
        self.size_bytes = count * esize
        e = lambda k: torch.empty(k, dtype=dtype, device=device)
        if name in ("all_reduce", "broadcast"):
            self.inp = self.out = e(count)
        elif name == "all_gather":
            self.inp, self.out = e(self.chunk), e(count)
        elif name == "reduce_scatter":
            self.inp, self.out = e(count), e(self.chunk)
        elif name in ("all_to_all", "sendrecv"):
            self.inp, self.out = e(count), e(count)
        else:
            raise ValueError(f"unknown op {name!r}; known: {', '.join(OPS)}")

    def call(self) -> None:
        n, r = self.n, self.rank
        if self.name == "all_reduce":
            dist.all_reduce(self.inp)
        elif self.name == "all_gather":
            dist.all_gather_into_tensor(self.out, self.inp)
        elif self.name == "reduce_scatter":
            dist.reduce_scatter_tensor(self.out, self.inp)
        elif self.name == "broadcast":
            dist.broadcast(self.inp, src=0)
        elif self.name == "all_to_all":
            dist.all_to_all_single(self.out, self.inp)
        else:  # a ring, as nccl-tests' sendrecv: send to the next rank, receive from the previous
            ops = [dist.P2POp(dist.isend, self.inp, (r + 1) % n), dist.P2POp(dist.irecv, self.out, (r - 1) % n)]
            for w in dist.batch_isend_irecv(ops):
                w.wait()

    def fill(self) -> None:
        """Rank-dependent inputs for the check (overwrites whatever timing left there)."""
        r, n, p = self.rank, self.n, lambda k, s, c: _pattern(k, s, c, self.dtype, self.device)
        if self.name in ("reduce_scatter", "all_to_all"):  # chunk c is meant for rank c
            self.inp.copy_(torch.cat([p(self.chunk, r, c) for c in range(n)]))
        elif self.name == "all_gather":
            self.inp.copy_(p(self.chunk, r, 0))
        elif self.name == "broadcast":
            self.inp.copy_(p(self.count, 0, 0) if r == 0 else torch.zeros_like(self.inp))
        else:
            self.inp.copy_(p(self.count, r, 0))
        if self.out is not self.inp:
            self.out.zero_()

    def wrong(self) -> int:
        """Elements of this rank's output that differ from the expected value."""
        r, n, p = self.rank, self.n, lambda k, s, c: _pattern(k, s, c, torch.float32, self.device)
        m = self.chunk
        if self.name == "all_reduce":
            exp = (torch.arange(self.count, device=self.device, dtype=torch.int32) % 3 * n + _ranksum(n))
            return int((self.out.float() != exp.float()).sum())
        if self.name == "reduce_scatter":
            exp = (torch.arange(m, device=self.device, dtype=torch.int32) % 3 + (r % 3)) * n + _ranksum(n)
            return int((self.out.float() != exp.float()).sum())
        if self.name == "broadcast":
            return int((self.out.float() != p(self.count, 0, 0)).sum())
        if self.name == "sendrecv":
            return int((self.out.float() != p(self.count, (r - 1) % n, 0)).sum())
        # all_gather: chunk j came from rank j; all_to_all: chunk j is rank j's chunk meant for me
        bad = 0
        for j in range(n):
            exp = p(m, j, 0) if self.name == "all_gather" else p(m, j, r)
            bad += int((self.out[j * m:(j + 1) * m].float() != exp).sum())
        return bad


class Timer:
    """Back-to-back timing of a call on this rank's device; ``sync`` aligns ranks first."""

    def __init__(self, device: torch.device, use_events: bool):
        self.device, self.use_events = device, use_events
        self.probe = torch.zeros(1, device=device)

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        dist.all_reduce(self.probe)  # a tiny collective: every rank leaves it at about the same time
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def time(self, fn: Callable[[], None], iters: int) -> float:
        """Seconds per call of ``iters`` back-to-back calls of ``fn``."""
        self.sync()
        if self.use_events:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(iters):
                fn()
            b.record()
            b.synchronize()
            return a.elapsed_time(b) / 1e3 / iters
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return (time.perf_counter() - t0) / iters

    def across_ranks(self, seconds: float) -> tuple[float, float]:
        """(mean, max) of a per-rank number over ranks."""
        total = torch.tensor([seconds], dtype=torch.float64, device=self.device)
        mx = total.clone()
        dist.all_reduce(total)
        dist.all_reduce(mx, op=dist.ReduceOp.MAX)
        return float(total[0]) / dist.get_world_size(), float(mx[0])


def graph_call(fn: Callable[[], None], iters: int) -> Callable[[], None]:
    """``iters`` calls of ``fn`` captured once in a CUDA graph; the returned callable replays them."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()  # NCCL needs a warm communicator before capture
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(iters):
            fn()
    return g.replay


def _choose_iters(timer: Timer, fn: Callable[[], None], group: CollectiveGroupSpec) -> int:
    """``iters`` calls, or more (up to ``max_iters``) where a call is cheap enough that ``budget_s``
    allows it; every rank gets the same count (max of the per-rank single-call times)."""
    iters, budget = group.iters, group.budget_s
    if budget <= 0:
        return iters
    _, one = timer.across_ranks(timer.time(fn, 1))
    return int(min(max(iters, budget / max(one, 1e-7)), group.max_iters))


def measure(group: CollectiveGroupSpec, name: str, dtype_name: str, nbytes: int, timer: Timer,
            **facts: Any) -> dict[str, Any]:
    """One point's row (``facts``: the group's columns after its identity): check once, warm up,
    time back to back."""
    rank, n = dist.get_rank(), dist.get_world_size()
    op = Op(name, nbytes, DTYPES[dtype_name], timer.device, rank, n)
    op.fill()
    op.call()
    if timer.device.type == "cuda":
        torch.cuda.synchronize(timer.device)
    wrong = torch.tensor([op.wrong()], dtype=torch.int64, device=timer.device)
    dist.all_reduce(wrong)
    for _ in range(group.warmup):
        op.call()
    iters = _choose_iters(timer, op.call, group)
    graphed = (backends.get(group.backend).stream_ordered and name != "sendrecv"
               and op.size_bytes <= group.graph_max_bytes)
    if graphed:
        # one graph of `per` calls, replayed `reps` times: the replay launch is amortised
        per = min(iters, 100)
        reps = max(1, iters // per)
        replay = graph_call(op.call, per)
        replay()
        t = timer.time(replay, reps) / per
        iters = per * reps
    else:
        t = timer.time(op.call, iters)
    mean, mx = timer.across_ranks(t)
    algbw = op.size_bytes / mean / GB
    return start_row(group.point("sweep", name, dtype_name, op.size_bytes), **facts, count=op.count, iters=iters,
                     warmup=group.warmup, graph=graphed, time_s=mean, time_max_s=mx, algbw_gbs=algbw,
                     busbw_gbs=algbw * busbw_factor(name, n), wrong=int(wrong.item()))


def reference_loop(group: CollectiveGroupSpec, dtype_name: str, nbytes: int, device: torch.device,
                   **facts: Any) -> dict[str, Any]:
    """The plain torch loop the sweep must match: all_reduce back to back, one sync, perf_counter."""
    n = dist.get_world_size()
    x = torch.ones(nbytes // torch.tensor([], dtype=DTYPES[dtype_name]).element_size(),
                   dtype=DTYPES[dtype_name], device=device)
    iters = group.iters
    for _ in range(group.warmup):
        dist.all_reduce(x)
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    sync()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(x)
    sync()
    t = torch.tensor([time.perf_counter() - t0], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    mean = float(t[0]) / n / iters
    algbw = x.numel() * x.element_size() / mean / GB
    point = group.point("reference", "all_reduce", dtype_name, x.numel() * x.element_size())
    return start_row(point, **facts, count=x.numel(), iters=iters, warmup=group.warmup, graph=False, time_s=mean,
                     time_max_s=None, algbw_gbs=algbw, busbw_gbs=algbw * busbw_factor("all_reduce", n), wrong=None)


def run_plan(group: CollectiveGroupSpec) -> list[dict[str, Any]]:
    """Every op x dtype x size of the group on this rank; the rows (complete on every rank)."""
    rank = dist.get_rank()
    if group.device == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    else:
        device = torch.device("cpu")
    backend = backends.get(group.backend)
    timer = Timer(device, use_events=backend.stream_ordered)
    facts = {"gpu_name": torch.cuda.get_device_name(device)} if device.type == "cuda" else {}
    rows: list[dict[str, Any]] = []
    out = Path(group.out)
    for name in group.ops:
        # send/recv without the backend's point-to-point for these tensors hangs the receiver: not attempted
        failed = (NO_P2P.format(backend=backend.name) if name == "sendrecv" and backend.p2p_unsupported(device.type)
                  else None)
        for dt in group.dtypes:
            for nbytes in group.sizes:
                if failed is None:
                    try:
                        rows.append(measure(group, name, dt, nbytes, timer, **facts))
                        continue
                    except (RuntimeError, NotImplementedError, ValueError) as e:
                        if not _group_alive(timer):
                            # a peer died or raised: no later point can be measured; the rows written
                            # so far are kept and the launcher's failure row says why
                            raise
                        # An op the backend/device lacks fails on every rank before any communication,
                        # so the ranks stay in step; its other sizes and dtypes are not tried again.
                        failed = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
                rows.append(start_row(group.point("sweep", name, dt, nbytes), status="skipped", reason=failed,
                                      **facts))
            if rank == 0:
                _write(out, rows)
    if group.reference:
        for dt in group.dtypes:
            rows.append(reference_loop(group, dt, max(group.sizes), timer.device, **facts))
    if rank == 0:
        _write(out, rows)
    return rows


def _group_alive(timer: Timer) -> bool:
    """Whether every rank still answers a tiny collective: after an op failed on every rank alike
    (one the backend lacks) they do; after a peer died or raised, the collective fails at once
    (Gloo: "Connection closed by peer")."""
    try:
        timer.sync()
    except RuntimeError:  # torch.distributed.DistError is one
        return False
    return True


def _write(path: Path, rows: list[dict[str, Any]]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(rows))
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    """Worker entry point: ``python -m bench.comm.worker PLAN.json`` under torchrun."""
    argv = sys.argv[1:] if argv is None else argv
    err = Path(str(Path(argv[0]).with_suffix("")) + f"-r{os.environ.get('RANK', 0)}.err")
    try:
        return _run(load(CollectiveGroupSpec, Path(argv[0]).read_text()))
    except BaseException as e:
        # torchrun's own summary says only "To enable traceback see ..."; the traceback stays in its log
        text = str(e).splitlines()[0][:200] if str(e).strip() else ""
        err.write_text(f"{type(e).__name__}: {text}\n" if text else f"{type(e).__name__}\n")
        raise


def _run(group: CollectiveGroupSpec) -> int:
    """Init the process group, run the group's ladder, destroy the group."""
    from datetime import timedelta

    kwargs: dict[str, Any] = {"timeout": timedelta(seconds=group.pg_timeout_s)}
    if group.device == "cuda":
        local = int(os.environ.get("LOCAL_RANK", 0))
        torch.cuda.set_device(local)
        if backends.get(group.backend).bind_device:
            kwargs["device_id"] = torch.device("cuda", local)  # eager NCCL init, and barrier knows the GPU
    dist.init_process_group(group.backend, **kwargs)
    try:
        run_plan(group)
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
