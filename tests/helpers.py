"""Strategies that misbehave on purpose, to prove the harness notices (loaded as tests.helpers:X)."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
import torch.distributed as dist

from bench.core.metrics import Metric
from bench.workloads import Workload
from strategies.base import Context, Option, Step, Strategy
from strategies.common import local_share, train_step
from strategies.training import make_optimizer


class NoAverage(Strategy):
    """Data parallel that sums gradients but forgets to divide by the world size: it trains a
    different model than single device, and parity must say so."""

    name = "test-noaverage"
    summary = needs = "test only"

    def prepare(self, wl: Workload, ctx: Context) -> Step:
        model = wl.build(ctx.device)
        opt = make_optimizer(model.parameters(), ctx)

        def hook():
            for p in model.parameters():
                dist.all_reduce(p.grad)

        return Step(run=lambda b: train_step(model, wl, ctx, opt, local_share(b, ctx), after_backward=hook),
                    loss_weight=1.0 / ctx.world_size)


class Inert(Strategy):
    """Every rank trains the whole model on the whole batch and never communicates: parity holds
    (each rank is the single-device run) but nothing was distributed, and the check must say so."""

    name = "test-inert"
    summary = needs = "test only"
    distributes = ("comm", "split")

    def prepare(self, wl: Workload, ctx: Context) -> Step:
        model = wl.build(ctx.device)
        opt = make_optimizer(model.parameters(), ctx)
        return Step(run=lambda b: train_step(model, wl, ctx, opt, ctx.to_device(b)),
                    loss_weight=1.0 / ctx.world_size, optimizer=opt)


class SlowRank(Strategy):
    """Each rank trains its own copy; the last rank sleeps 20 ms more every step (a synthetic slow
    rank the noise flags must name)."""

    name = "test-slowrank"
    summary = needs = "test only"
    distributes = ()

    def prepare(self, wl: Workload, ctx: Context) -> Step:
        model = wl.build(ctx.device)
        opt = make_optimizer(model.parameters(), ctx)

        def run(b):
            if ctx.rank == ctx.world_size - 1:
                time.sleep(0.02)
            return train_step(model, wl, ctx, opt, ctx.to_device(b))

        return Step(run=run, loss_weight=1.0 / ctx.world_size, optimizer=opt)


class _SlowedDDP(Strategy):
    """Data parallel whose step first sleeps what :meth:`extra` returns (seconds, asked each step)."""

    summary = needs = "test only"

    def extra(self) -> Callable[[], float]:
        raise NotImplementedError

    def prepare(self, wl: Workload, ctx: Context) -> Step:
        from torch.nn.parallel import DistributedDataParallel as DDP

        delay = self.extra()
        model = DDP(wl.build(ctx.device))
        opt = make_optimizer(model.parameters(), ctx)

        def run(b):
            time.sleep(delay())
            return train_step(model, wl, ctx, opt, local_share(b, ctx))

        return Step(run=run, loss_weight=1.0 / ctx.world_size, optimizer=opt)


class SlowProfiled(_SlowedDDP):
    """Steps 0.25 s slower while torch.profiler records them, in the first ``slow_sessions``
    profiler sessions of a build (every session when None): a profiler that slows the step on some
    passes and not on others, or on every one."""

    name = "test-slow-profiled"
    slow_sessions: int | None = None

    def extra(self) -> Callable[[], float]:
        from torch.autograd import profiler

        seen = {"sessions": 0, "on": False}

        def delay() -> float:
            on = profiler._is_profiler_enabled
            seen["sessions"] += on and not seen["on"]
            seen["on"] = on
            return 0.25 if on and (self.slow_sessions is None or seen["sessions"] <= self.slow_sessions) else 0.0

        return delay


class SlowFirstProfiled(SlowProfiled):
    name = "test-slow-first-profiled"
    slow_sessions = 1


class SlowProfiledBuild(_SlowedDDP):
    """Sleeps 0.1 s a step, and while torch.profiler records, ``slowdowns[i]`` s more on the
    (i+1)-th of its profile pass's builds that records any (none more on later ones): builds on
    which every timing pass is off, then one on which none is. Keyed to the builds that profile,
    a build the pass skips before profiling (its unprofiled steps off on a busy host) changes
    nothing."""

    name = "test-slow-profiled-build"
    slowdowns: tuple[float, ...] = (0.25,)
    profiled: dict[str, int] = {}

    def extra(self) -> Callable[[], float]:
        import inspect

        from torch.autograd import profiler

        in_pass = any(f.function == "profile_cell" for f in inspect.stack())
        me: dict[str, int] = {}

        def delay() -> float:
            if not (in_pass and profiler._is_profiler_enabled):
                return 0.1
            if "k" not in me:
                me["k"] = SlowProfiledBuild.profiled[self.name] = SlowProfiledBuild.profiled.get(self.name, 0) + 1
            return 0.1 + (self.slowdowns[me["k"] - 1] if me["k"] <= len(self.slowdowns) else 0.0)

        return delay


class SlowerProfiledBuilds(SlowProfiledBuild):
    """Off under the profiler on every build of its profile pass, least on the first."""

    name = "test-slower-profiled-builds"
    slowdowns = (0.25, 0.5, 0.5)


class SlowBuilds(_SlowedDDP):
    """Sleeps 0.05 s a step, 0.1 s more in its builds in a process from the second on (the first
    is its timed repeat's), up to build ``last_slow`` (every later build when None): a cell that
    steps at another speed from one build to the next."""

    name = "test-slow-builds"
    last_slow: int | None = None
    builds: dict[str, int] = {}

    def extra(self) -> Callable[[], float]:
        k = SlowBuilds.builds[self.name] = SlowBuilds.builds.get(self.name, 0) + 1
        slow = k >= 2 and (self.last_slow is None or k <= self.last_slow)
        return lambda: 0.15 if slow else 0.05


class SlowSecondBuild(SlowBuilds):
    name = "test-slow-second-build"
    last_slow = 2


class Raises(Strategy):
    name = "test-raises"
    summary = needs = "test only"

    def prepare(self, wl: Workload, ctx: Context) -> Step:
        raise RuntimeError("deliberate failure in prepare")


class Hangs(Strategy):
    name = "test-hangs"
    summary = needs = "test only"

    def prepare(self, wl: Workload, ctx: Context) -> Step:
        time.sleep(3600)
        raise AssertionError("unreachable")


class _SecondBuild(Strategy):
    """Data parallel that misbehaves when built for its profile pass (``--profile-at end``:
    ``bench.train.profile.profile_cell``); built for its timed repeats it trains normally."""

    summary = needs = "test only"

    def prepare(self, wl: Workload, ctx: Context) -> Step:
        import inspect

        if any(f.function == "profile_cell" for f in inspect.stack()):
            self.misbehave()
        from torch.nn.parallel import DistributedDataParallel as DDP

        model = DDP(wl.build(ctx.device))
        opt = make_optimizer(model.parameters(), ctx)
        return Step(run=lambda b: train_step(model, wl, ctx, opt, local_share(b, ctx)),
                    loss_weight=1.0 / ctx.world_size, optimizer=opt)

    def misbehave(self) -> None:
        raise NotImplementedError


class RaisesWhenProfiled(_SecondBuild):
    name = "test-raises-when-profiled"

    def misbehave(self) -> None:
        raise RuntimeError("deliberate failure in the profile pass")


class HangsWhenProfiled(_SecondBuild):
    name = "test-hangs-when-profiled"

    def misbehave(self) -> None:
        time.sleep(3600)


class KnownCommSerial(Strategy):
    """A known amount of compute (matmuls) and one all-reduce of a known 16 MiB buffer per step,
    one after the other. ``finish`` times the same all-reduce alone, for comparison."""

    name = "test-comm-serial"
    summary = needs = "test only"
    overlap = False
    metrics = (Metric(name="alone_comm_s", dtype="float64", unit="s", over_ranks="max"),
               Metric(name="stopwatch_comm_s", dtype="float64", unit="s", over_ranks="max"),
               Metric(name="comm_bytes", dtype="float64", unit="B", over_ranks="max"))
    numel = 16 * 2**20  # 64 MiB: long enough that thread wake-ups on a busy 2-core VM are noise
    matmuls = 12

    def prepare(self, wl: Workload, ctx: Context) -> Step:
        import statistics
        import time as _time

        import torch

        buf = torch.ones(self.numel)
        stopwatch: list[float] = []
        a = torch.randn(384, 384, generator=torch.Generator().manual_seed(0)) / 20

        def compute():
            x = a
            for _ in range(self.matmuls):
                x = torch.tanh(x @ a)
            return x

        def run(_batch):
            if self.overlap:
                work = dist.all_reduce(buf, async_op=True)
                compute()
                work.wait()
            else:
                # Line the ranks up first, as the collective "timed alone" is: without this the
                # all-reduce also holds the wait for the peer still computing the last step.
                dist.barrier()
                t0 = _time.perf_counter()
                dist.all_reduce(buf)
                stopwatch.append(_time.perf_counter() - t0)
                compute()
            buf.fill_(1.0)
            return None

        def finish():
            times = []
            for _ in range(15):
                dist.barrier()
                t0 = _time.perf_counter()
                dist.all_reduce(buf)
                times.append(_time.perf_counter() - t0)
            out = {"alone_comm_s": statistics.median(times), "comm_bytes": float(buf.numel() * 4)}
            if stopwatch:  # the last calls are the profiled steps
                out["stopwatch_comm_s"] = statistics.median(stopwatch[-15:])
            return out

        return Step(run=run, loss_weight=0.0, finish=finish)


class KnownCommOverlap(KnownCommSerial):
    name = "test-comm-overlap"
    overlap = True
    # Compute clearly outlasts the all-reduce, even with 2 ranks' compute and Gloo threads sharing
    # 2 cores (which stretches a 16 MiB all-reduce past 100 ms here): 256 KiB under 64 matmuls.
    matmuls = 64
    numel = 2**16


# --- Faults (tests/distributed/test_faults.py): each must become a row with its status and reason,
# and leave no process behind.

class KillsRank(Strategy):
    """The last rank SIGKILLs itself in the middle of the cell's steps (a segfault, the OOM killer)."""

    name = "test-killsrank"
    summary = needs = "test only"

    def prepare(self, wl: Workload, ctx: Context) -> Step:
        import os
        import signal

        model = wl.build(ctx.device)
        opt = make_optimizer(model.parameters(), ctx)
        calls = [0]

        def run(b):
            calls[0] += 1
            if ctx.rank == ctx.world_size - 1 and calls[0] == 2:
                os.kill(os.getpid(), signal.SIGKILL)
            return train_step(model, wl, ctx, opt, local_share(b, ctx))

        return Step(run=run, loss_weight=1.0 / ctx.world_size)


class HangsInCollective(Strategy):
    """Rank 0 waits in an all-reduce the last rank never joins; the last rank also ignores SIGTERM,
    so stopping it takes the launcher's SIGKILL."""

    name = "test-hangs-collective"
    summary = needs = "test only"

    def prepare(self, wl: Workload, ctx: Context) -> Step:
        import signal

        import torch

        def run(_b):
            if ctx.rank == ctx.world_size - 1:
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
                time.sleep(3600)
            dist.all_reduce(torch.ones(4))
            return None

        return Step(run=run, loss_weight=0.0)


class RaisesMidStep(Strategy):
    """The last rank raises in its second step while the others wait for its message (a one-rank
    failure in the middle of a collective: they would wait until the cell timeout)."""

    name = "test-raises-midstep"
    summary = needs = "test only"

    def prepare(self, wl: Workload, ctx: Context) -> Step:
        import torch

        calls = [0]
        last = ctx.world_size - 1

        def run(_b):
            calls[0] += 1
            if ctx.rank == last:
                if calls[0] == 2:
                    raise RuntimeError("deliberate failure in step 2 on the last rank")
                for peer in range(last):
                    dist.send(torch.ones(4), dst=peer)
            else:
                dist.recv(torch.empty(4), src=last)
            return None

        return Step(run=run, loss_weight=0.0)


class OutOfMemory(Strategy):
    """The last rank raises what torch raises when the GPU is full (with brackets in the text, which
    a terminal must show verbatim)."""

    name = "test-oom"
    summary = needs = "test only"

    def prepare(self, wl: Workload, ctx: Context) -> Step:
        import torch

        def run(_b):
            if ctx.rank == ctx.world_size - 1:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB [/x] [bold]err == 0.[/]")
            return None

        return Step(run=run, loss_weight=0.0)


def broken_batches(*, seed: int = 0, global_batch: int = 8) -> Workload:
    """A user workload that plans fine (its first batch is whole) but whose data loader raises
    inside the ranks, from its second batch on."""
    from bench.workloads import resolve

    wl = resolve("mlp", seed=seed, global_batch=global_batch)

    def batch(step: int):
        if step == 0:
            return wl.batch(0)
        raise ValueError(f"broken user data loader at step {step}")

    import dataclasses

    return dataclasses.replace(wl, name="broken-batches", batch=batch)


def short_batch(*, seed: int = 0, global_batch: int = 16) -> Workload:
    """A user workload whose batch() returns fewer samples than the global batch it declares."""
    import dataclasses

    from bench.workloads import resolve

    wl = resolve("mlp", seed=seed, global_batch=global_batch)
    return dataclasses.replace(wl, name="short-batch", batch=lambda step: tuple(t[:6] for t in wl.batch(step)))


def factory_exits(*, seed: int = 0) -> Workload:
    """A user workload factory that asks the whole command to exit."""
    import sys

    sys.exit(3)


def factory_chdir(*, seed: int = 0, global_batch: int = 8) -> Workload:
    """A user workload factory that changes the working directory (to the system's temporary folder)."""
    import os
    import tempfile

    from bench.workloads import resolve

    os.chdir(tempfile.gettempdir())
    return resolve("mlp", seed=seed, global_batch=global_batch)


def factory_forks(*, seed: int = 0, global_batch: int = 8) -> Workload:
    """A user workload factory that forks a child which ignores SIGTERM and sleeps (a server it
    starts), writing the child's pid to a file in $PARBENCH_TEST_PIDS where that is set."""
    import os
    import signal

    from bench.workloads import resolve

    pid = os.fork()
    if pid == 0:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        time.sleep(300)
        os._exit(0)
    if os.environ.get("PARBENCH_TEST_PIDS"):
        with open(os.path.join(os.environ["PARBENCH_TEST_PIDS"], str(pid)), "w"):
            pass
    return resolve("mlp", seed=seed, global_batch=global_batch)


def factory_thread(*, seed: int = 0, global_batch: int = 8) -> Workload:
    """A user workload factory that leaves a non-daemon thread running (a data loader's worker)."""
    import threading

    from bench.workloads import resolve

    threading.Thread(target=time.sleep, args=(3600,), name="user-loader", daemon=False).start()
    return resolve("mlp", seed=seed, global_batch=global_batch)


def factory_raises(*, seed: int = 0) -> Workload:
    """A user workload factory that raises while the run is planned."""
    raise RuntimeError("deliberate failure in the factory [/x]")


def factory_hangs(*, seed: int = 0) -> Workload:
    """A user workload factory that never returns while the run is planned (it sleeps)."""
    time.sleep(3600)
    raise AssertionError("unreachable")


# --- Links between nodes (tests/distributed/test_netns.py): a known amount of traffic per step.

class LinkProbe(Strategy):
    """Per step: one all-reduce of ``probe_kib`` KiB (2 ranks: each direction carries the whole
    buffer, concurrently) and then ``pingpongs`` round trips of a 4-byte message from rank 0 to
    the last rank and back. No model: what a slower link adds to a step is the link's own cost."""

    name = "test-linkprobe"
    summary = needs = "test only"
    distributes = ()
    options = (Option(name="probe_kib", type=int, default=1024, minimum=0, help="all-reduce size per step"),
               Option(name="pingpongs", type=int, default=0, minimum=0, help="4-byte round trips per step"))

    def prepare(self, wl: Workload, ctx: Context) -> Step:
        import torch

        buf = torch.ones(ctx.options["probe_kib"] * 256)
        tiny = torch.ones(1)
        last = ctx.world_size - 1

        def run(_batch):
            if buf.numel():
                dist.all_reduce(buf)
                buf.fill_(1.0)
            for _ in range(ctx.options["pingpongs"]):
                if ctx.rank == 0:
                    dist.send(tiny, last)
                    dist.recv(tiny, last)
                elif ctx.rank == last:
                    dist.recv(tiny, 0)
                    dist.send(tiny, 0)
            return None

        return Step(run=run, loss_weight=0.0)


# --- Serving with a broken user model (tests/unit/test_serve_cli.py): forward raises or never returns.

class _ForwardRaises(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(16, 4)

    def forward(self, x):
        raise RuntimeError("forward exploded on purpose\nsecond line")


class _ForwardHangs(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(16, 4)

    def forward(self, x):
        time.sleep(600)


def _classifier(name: str, ctor) -> Workload:
    import torch.nn.functional as F

    from bench.workloads import build_on, seeded

    def batch(step: int):
        g = seeded(0, step)
        return torch.randn(8, 16, generator=g), torch.randint(0, 4, (8,), generator=g)

    return Workload(name=name, build=lambda dev: build_on(dev, 0, ctor), batch=batch,
                    loss=lambda o, t: F.cross_entropy(o.float(), t), global_batch=8, n_blocks=1)


def forward_raises(*, seed: int = 0, global_batch: int = 8) -> Workload:
    """A servable user workload whose forward raises."""
    return _classifier("forward-raises", _ForwardRaises)


def forward_hangs(*, seed: int = 0, global_batch: int = 8) -> Workload:
    """A servable user workload whose forward never returns (sleeps)."""
    return _classifier("forward-hangs", _ForwardHangs)


def global_batch_zero(*, seed: int = 0) -> Workload:
    """A user workload whose factory builds a global batch of 0 (it ran 'ok' with a NaN efficiency)."""
    import dataclasses

    from bench.workloads import resolve

    return dataclasses.replace(resolve("mlp", seed=seed), name="batch-zero", global_batch=0)


# --- Serving with a user model that kills its process (tests/faults/test_serve.py).

class _ForwardCrashes(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(16, 4)

    def forward(self, x):
        import os
        import signal

        os.kill(os.getpid(), signal.SIGSEGV)  # the process dies as a native crash would, saying nothing


def forward_crashes(*, seed: int = 0, global_batch: int = 8) -> Workload:
    """A servable user workload whose forward kills its process (SIGSEGV)."""
    return _classifier("forward-crashes", _ForwardCrashes)


def factory_os_exit(*, seed: int = 0) -> Workload:
    """A user workload factory that ends the process it runs in, past every handler."""
    import os

    os._exit(7)


def factory_crashes(*, seed: int = 0) -> Workload:
    """A user workload factory that crashes the interpreter (a bad pointer in an extension)."""
    import ctypes

    ctypes.string_at(0)
