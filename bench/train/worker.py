"""Inside one rank: one process group, the group's cells one after another, each isolated.

Started by ``bench.train.launcher`` through torchrun as ``python -m bench.train.worker PLAN.json`` (a
:class:`bench.core.spec.GroupPlan`). Each rank measures each cell into a
:class:`bench.core.spec.RankMeasurement`; the leader gathers them and sends them to the launcher as a
``measured`` event, where the row is built. The leader is the first rank of node 0 (on one node,
rank 0): on several nodes c10d assigns global ranks by node, not by --node-rank, and node 0's
launcher is the one that writes the tables. Any rank that fails reports an ``error`` event at once,
so the launcher can tell a failed cell from a hung one.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import tempfile
import threading
import time
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

import strategies
from bench.core import backends
from bench.core import spec
from bench.measure.nvml import EnergyMeter
from bench.core.spec import CellSpec, GroupPlan, RankMeasurement, deferred
from bench.measure.timing import StepTimer, order_stat_halfwidth
from bench.workloads import resolve
from strategies.base import Context

_T_IMPORTED = time.time()


class Events:
    """Append-only JSON lines, flushed per line so the launcher sees progress as it happens."""

    def __init__(self, path: Path):
        self.f = open(path, "a", buffering=1)

    def emit(self, event: spec.Event) -> None:
        self.f.write(spec.dump(event) + "\n")
        self.f.flush()


def one_line(e: BaseException) -> str:
    msg = " ".join(str(e).split())
    return f"{type(e).__name__}: {msg}"[:500]


def rank_devices(cell: CellSpec, local_rank: int) -> tuple[torch.device, ...]:
    """The devices this rank drives in ``cell``, from the planned device ids: all of them for a
    one-process cell, the rank's own otherwise."""
    if cell.device != "cuda":
        return (torch.device("cpu"),)
    if cell.n_procs == 1:
        return tuple(torch.device("cuda", i) for i in cell.devices)
    return (torch.device("cuda", cell.devices[local_rank]),)


def profile_steps(step, batches, cell: CellSpec, device: torch.device, trace_path: Path | None, *,
                  n: int, gpu: bool) -> dict[str, Any]:
    """Run ``n`` more steps under torch.profiler (GPU activity too when ``gpu``); returns the
    Chrome trace as a dict."""
    from torch.profiler import ProfilerActivity, profile, record_function

    m = cell.measure
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if gpu and device.type == "cuda" else [])
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    dist.barrier()
    with profile(activities=acts, record_shapes=True) as prof:
        for k in range(n):
            with record_function("parbench_step"):
                step.run(batches[(m.warmup + k % m.steps) % len(batches)])
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    keep = trace_path is not None
    path = trace_path or Path(tempfile.mkstemp(suffix=".json", prefix="parbench-trace-")[1])
    try:
        prof.export_chrome_trace(str(path))
        return json.loads(path.read_text())
    finally:
        if not keep:
            path.unlink(missing_ok=True)


def local_numel(opt: torch.optim.Optimizer | None) -> int | None:
    """Parameter elements this rank holds, from its optimizer (a DTensor counts its local shard)."""
    if opt is None:
        return None
    from torch.distributed.tensor import DTensor

    seen, n = set(), 0
    for g in opt.param_groups:
        for p in g["params"]:
            if id(p) not in seen:
                seen.add(id(p))
                n += (p.to_local() if isinstance(p, DTensor) else p).numel()
    return n


CHUNK = 5  # steps between decisions of the adaptive warm-up and timed loops
BATCH_POOL = 64  # distinct global batches staged per cell; step s trains batch s % BATCH_POOL


def agreed(times: list[float], backend: backends.Backend, device: torch.device,
           deadline: float | None = None) -> tuple[np.ndarray, bool]:
    """Each step's time as the slowest rank saw it, and whether any rank is past ``deadline``,
    known to every rank, so that all ranks take the same decision (one small all-reduce, between
    chunks, outside the timed steps)."""
    late = float(deadline is not None and time.time() > deadline)
    t = torch.tensor([*times, late], dtype=torch.float64, device=device if backend.bind_device else "cpu")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    x = t.cpu().numpy()
    return x[:-1], bool(x[-1])


def chunk_within(x: np.ndarray | None, left: int, allowance_s: float | None) -> int:
    """Steps of the next chunk of an adaptive loop: CHUNK, no more than ``left``, and, with an
    allowance, no more than the latest step time says fit in what the steps ``x`` left of it (at
    least one while any is left; 0 once it is spent)."""
    n = min(CHUNK, max(left, 0))
    if allowance_s is None or x is None or not x.size or n == 0:
        return n
    rest = allowance_s - float(x.sum())
    if rest <= 0:
        return 0
    per = float(x[-1])
    return n if per <= 0 else max(1, min(n, int(np.ceil(rest / per))))


def settled(x: np.ndarray, tol: float) -> bool:
    """The median of the last CHUNK steps moved less than ``tol`` from the CHUNK before."""
    if x.size < 2 * CHUNK:
        return False
    a, b = float(np.median(x[-CHUNK:])), float(np.median(x[-2 * CHUNK:-CHUNK]))
    return b > 0 and abs(a - b) / b < tol


#: Where this process runs (bench.multinode.netinfo.placement), found once per process group.
PLACE: dict[str, Any] = {}


def _build(cell: CellSpec, local_rank: int, out: RankMeasurement):
    """A cell's model under its strategy, and its batches staged on the device: (devices, device,
    batches, step, memory each device held before the cell). Fills ``out``'s device facts."""
    m = cell.measure
    rank = dist.get_rank()
    devices = rank_devices(cell, local_rank)
    device = devices[0]
    if device.type == "cuda":
        from bench.multinode.netinfo import device_names

        out.device_ids = device_names([d.index for d in devices])
    wl = resolve(cell.workload.spec, seed=m.seed, global_batch=cell.workload.global_batch, **cell.workload.dims)
    if wl.global_batch != cell.workload.global_batch:
        raise ValueError(f"workload {cell.workload.name} built a global batch of {wl.global_batch}, the plan asked "
                         f"{cell.workload.global_batch}: its factory must accept global_batch")
    strat = strategies.get(cell.strategy_spec)
    ctx = Context(rank=rank, world_size=dist.get_world_size(), local_rank=local_rank, device=device,
                  devices=devices, backend=cell.backend, seed=m.seed, precision=m.precision, lr=m.lr,
                  options=dict(cell.options))
    before: list[int] = []
    if device.type == "cuda":
        out.gpu_name = torch.cuda.get_device_name(device)
        # What every device held before this cell (the group's warm-up tensors, caches): a
        # device counts as used only if the cell's training grew it.
        before = [torch.cuda.memory_allocated(d) for d in devices]
    # Every strategy gets the same global batches, staged on the device before timing starts.
    most = max(m.warmup, m.warmup_max) + max(m.steps, m.steps_max)
    batches = [ctx.to_device(wl.batch(s)) for s in range(min(most, BATCH_POOL))]
    step = strat.prepare(wl, ctx)
    return devices, device, batches, step, before


def run_cell(cell: CellSpec, plan: GroupPlan, local_rank: int, *, first: bool = True) -> RankMeasurement:
    """Build, warm up to steady state, time until the interval target or a cap, profile (first
    repeat only); returns this rank's measurements (never raises)."""
    rank = dist.get_rank()
    out = RankMeasurement(rank=rank, **PLACE)
    step = None
    m = cell.measure
    try:
        devices, device, batches, step, before = _build(cell, local_rank, out)
        backend = backends.get(cell.backend)
        out.loss_weight = step.loss_weight
        losses: list[Any] = []

        def run_steps(timer: StepTimer, n: int) -> None:
            for _ in range(n):
                s = len(losses)
                losses.append(timer.time(lambda: step.run(batches[s % len(batches)])))  # noqa: B023

        # Warm-up: the asked steps, then more in chunks until the step time settles (or the cap).
        # Warm-up may take half the time cap; the next chunk is sized to what is left of that half
        # (a time-capped cell of the default 4-GPU matrix under its 10-minute budget, 0.4 s a cell,
        # ran 1 + 5 warm-up steps of 0.5-5 s on Gloo: 114 of its 576 s). Same decisions on every
        # rank: the agreed times, not each rank's own clock.
        warm = StepTimer(device)
        run_steps(warm, m.warmup)
        adaptive = m.warmup_max > len(losses) and m.settle > 0
        x, late = agreed(warm.times(), backend, device, plan.deadline_unix) if adaptive else (None, False)
        while adaptive and m.warmup_max > len(losses):
            n = chunk_within(x, m.warmup_max - len(losses), m.time_cap_s / 2 if m.time_cap_s else None)
            if late or n == 0:
                break
            run_steps(warm, n)
            x, late = agreed(warm.times(), backend, device, plan.deadline_unix)
            if settled(x, m.settle):
                break
        out.warmup_steps = len(losses)
        meter = EnergyMeter([d.index for d in devices]) if device.type == "cuda" else None
        if device.type == "cuda":
            for d in devices:  # the peak of training, not of building the full model before sharding it
                torch.cuda.synchronize(d)
                torch.cuda.reset_peak_memory_stats(d)
        # The ranks start the timed steps together, as a plain loop does: otherwise the first timed
        # step carries the skew the warm-up left between ranks (seen on 4 H100s: a 125 ms first step
        # in a 45 ms DDP cell, which the noise flags then reported as bimodal with an outlier).
        e0 = meter.read() if meter else None  # NVML takes milliseconds: before the barrier, not after it
        dist.barrier()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.time()
        # Timed: the asked steps, then more in chunks until the median's interval is narrow enough,
        # the step cap or the time cap.
        timer = StepTimer(device)
        run_steps(timer, m.steps)
        if m.steps_max > m.steps and m.target_ci > 0:
            out.target_reached = False
            while True:
                x, late = agreed(timer.times(), backend, device, plan.deadline_unix)
                if order_stat_halfwidth(x) <= m.target_ci:
                    out.target_reached = True
                    break
                n = chunk_within(x, m.steps_max - x.size, m.time_cap_s or None)
                if late or n == 0:
                    break
                run_steps(timer, n)
        out.times = timer.times()  # synchronises the device
        t1, e1 = time.time(), (meter.read() if meter else None)
        if device.type == "cuda":
            peaks = [torch.cuda.max_memory_allocated(d) for d in devices]
            out.peak_mem = float(max(peaks))
            out.devices_used = spec.devices_grown(peaks, before)
        out.window = (t0, t1)
        out.starts = timer.starts(t0)
        if e0 is not None and e1 is not None:
            out.energy_j = e1 - e0
        out.losses = [float("nan") if x is None else float(x) for x in losses]
        if not first:  # profiling, evidence and the strategy's own metrics come from the first repeat
            return out
        # Profiled steps give the breakdown and the communication records; without them, or when
        # they are deferred to the group's profile pass (profile_at "end"), one step is profiled on
        # the CPU side only, for the distribution check's communication evidence.
        tp = time.perf_counter()
        here = m.profile_steps > 0 and not deferred(cell)
        _profile(out, step, batches, cell, plan, device, backend, n=m.profile_steps if here else 1, full=here)
        out.profile_s = time.perf_counter() - tp
        out.param_numel = local_numel(step.optimizer)
        if step.finish is not None:
            out.metrics.update(step.finish())
        if step.self_parity is not None:
            out.self_parity = step.self_parity()
    except Exception as e:  # noqa: BLE001 - a failing cell is a row, not a crash
        out.status, out.reason = "failed", one_line(e)
        if os.environ.get("PARBENCH_DEBUG"):
            traceback.print_exc()
    finally:
        step = None  # drop the model before the next cell is built
        _release(cell)
    return out


def _profile(out: RankMeasurement, step, batches, cell: CellSpec, plan: GroupPlan, device: torch.device,
             backend: backends.Backend, *, n: int, full: bool) -> None:
    """``n`` profiled steps into ``out``: the communication per step (the distribution check's
    evidence) always; with ``full``, GPU activity too, the breakdown and the communication records
    (and the trace kept under the run's traces when asked)."""
    from bench.measure.trace import analyze_trace, comm_volume

    trace_path = Path(plan.trace_dir) / f"cell{cell.cell_id}-rank{out.rank}.json" if plan.trace_dir and full else None
    trace = profile_steps(step, batches, cell, device, trace_path, n=n, gpu=full)
    if full:
        out.breakdown, out.comm = analyze_trace(trace, device.type, n, backend)
    calls, nbytes = comm_volume(trace, backend)
    out.comm_calls_per_step, out.comm_bytes_per_step = calls / n, nbytes / n


def _release(cell: CellSpec) -> None:
    """Free what a cell left (its model is already dropped) before the next one is built."""
    gc.collect()
    if torch.cuda.is_available() and cell.device == "cuda":
        torch.cuda.empty_cache()


def profile_cell(cell: CellSpec, plan: GroupPlan, local_rank: int, warmup: int) -> RankMeasurement:
    """A cell's deferred profile pass: build it again, run ``warmup`` steps (what its first timed
    repeat needed to settle), then its profiled steps; returns this rank's breakdown, communication
    records and the pass's time (build included) as ``profile_s`` (never raises).

    Why deferred: a profiler session with GPU activity leaves the process slower at launching work
    even with CUPTI torn down (x1.09 on a launch-bound loop, ``tools/baselines/profiler_aftereffect.py``),
    and the harness's ranks go on to time the group's later cells; on 2 H100s a host-bound tensor-sp
    cell timed after the reference cell's GPU-profiled steps moved 16-26% from round to round within a
    call, and held within 0.2% without them (tenth stop, CPU-only profiling; twelfth, this pass) while
    its plain loop beside it moved 8-10% (docs/RESULTS.md)."""
    out = RankMeasurement(rank=dist.get_rank(), **PLACE)
    step = None
    tp = time.perf_counter()
    try:
        _, device, batches, step, _ = _build(cell, local_rank, out)
        for k in range(max(warmup, 1)):
            step.run(batches[k % len(batches)])
        _profile(out, step, batches, cell, plan, device, backends.get(cell.backend), n=cell.measure.profile_steps,
                 full=True)
    except Exception as e:  # noqa: BLE001 - a failed pass leaves the cell's timing alone
        out.status, out.reason = "failed", one_line(e)
        if os.environ.get("PARBENCH_DEBUG"):
            traceback.print_exc()
    finally:
        step = None
        _release(cell)
    out.profile_s = time.perf_counter() - tp
    return out


def _past_deadline(plan: GroupPlan) -> bool:
    """The run's deadline (its time budget) has passed: rank 0's clock decides, for every rank."""
    if plan.deadline_unix is None:
        return False
    late = [time.time() > plan.deadline_unix]
    dist.broadcast_object_list(late, src=0)
    return bool(late[0])


def warm_group(device: torch.device, precision: str, extra_gpus: tuple[int, ...] = ()) -> None:
    """Pay the once-per-process costs before the first cell, so no cell carries them: the
    communicator (NCCL creates it at the first collective), the CUDA context and the cuBLAS
    handles, in fp32 and in the precision the cells use, on every GPU a one-process cell drives."""
    x = torch.ones(64, 64, device=device)
    dist.all_reduce(x)
    dist.broadcast(x, 0)
    y = x @ x
    if precision == "bf16" and device.type == "cuda":
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = (y @ y).float()
    for i in extra_gpus:
        z = torch.ones(64, 64, device=f"cuda:{i}")
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=precision == "bf16"):
            (z @ z).float().sum().item()
    dist.all_gather_object([None] * dist.get_world_size(), float(y.sum()))
    dist.barrier()


def williams(m: int) -> list[list[int]]:
    """The rows of a balanced Latin square (Williams, 1949) on ``m`` items: over the rows each item
    takes each position equally often and follows each other item equally often (m rows for even
    m; for odd m the square and its mirror, 2m rows)."""
    if m <= 1:
        return [[0] * m]
    first, lo, hi = [0], 1, m - 1
    for i in range(1, m):
        if i % 2:
            first.append(lo)
            lo += 1
        else:
            first.append(hi)
            hi -= 1
    rows = [[(x + k) % m for x in first] for k in range(m)]
    return rows + [r[::-1] for r in rows] if m % 2 else rows


def rounds(plan: GroupPlan) -> list[list[tuple[CellSpec, int]]]:
    """The group's measurements as rounds: round k measures every cell that still has a repeat
    left. With several rounds their orders are the rows of a balanced Latin square (:func:`williams`)
    on the group's m cells, the cells' places in it and the first row drawn from the seed: every m
    rounds (from the first) put every cell in every position once, and every m rounds (even m) or
    2m rounds (odd m) put every cell after every other cell equally often, so slow drift of the
    machine and whatever a cell leaves behind in the processes land on every cell alike (a fresh
    shuffle per round did not: with seed 0 a 3-cell group ran in one order in rounds 2-4, its
    middle cell never first or last). Fewer rounds than cells cannot balance positions. The balance
    counts neighbours within a round: the last cell of one round and the first of the next are not
    balanced (with 2 cells, A B / B A, a cell follows itself there). A relaunch (after a crash or a
    timeout) starts a new square on the cells left, so the claims hold per launch. A single round
    keeps the planned order (the reference first)."""
    import random

    left = {c.cell_id: c.measure.repeats - plan.first_repeat.get(str(c.cell_id), 0) for c in plan.cells}
    start = {c.cell_id: plan.first_repeat.get(str(c.cell_id), 0) for c in plan.cells}
    n = max(left.values(), default=0)
    if n <= 1:
        return [[(c, start[c.cell_id]) for c in plan.cells if left[c.cell_id] > 0]] if n else []
    rng = random.Random((plan.cells[0].measure.seed if plan.cells else 0) * 7919 + 17)
    cells = list(plan.cells)
    symbol = dict(zip((c.cell_id for c in cells), rng.sample(range(len(cells)), len(cells))))
    m = len(cells)
    rows = williams(m)
    offset = rng.randrange(m)
    out = []
    for k in range(n):
        # rounds k..k+m-1 from 0 are m rows of one square (odd m: the square, then its mirror), so
        # every m rounds from the first give each cell each position once, whatever the offset
        row = rows[((k // m) % (len(rows) // m)) * m + (offset + k) % m]
        place = {sym: i for i, sym in enumerate(row)}
        todo = sorted((c for c in cells if left[c.cell_id] > k), key=lambda c: place[symbol[c.cell_id]])
        out.append([(c, start[c.cell_id] + k) for c in todo])
    return out


LAUNCHER_ENV = "PARBENCH_LAUNCHER_PID"  # bench.train.launcher.LAUNCHER_ENV (not imported: keeps ranks light)
WATCHDOG_EXIT = 70  # a rank that left because its launcher or torchrun agent is gone
WATCHDOG_POLL_S = 0.5


def _alive(p) -> bool:
    import psutil

    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def start_watchdog(err_path: Path) -> None:
    """Exit this rank when the launcher or the torchrun agent is gone (killed, even by SIGKILL,
    which nothing can catch): otherwise the rank would run the group's remaining cells, or hang in
    a collective, with nobody left to read its results or stop it. The agent is gone when this
    process is re-parented (to the launcher, a subreaper, or to init)."""
    import psutil

    agent = os.getppid()
    launcher = None
    if os.environ.get(LAUNCHER_ENV, "").isdigit():
        try:
            launcher = psutil.Process(int(os.environ[LAUNCHER_ENV]))
        except psutil.Error:  # killed while this rank was importing torch
            _write_error(err_path, "watchdog: the launcher is gone; this rank exits")
            os._exit(WATCHDOG_EXIT)

    def watch() -> None:
        while True:
            time.sleep(WATCHDOG_POLL_S)
            gone = ("torchrun agent" if os.getppid() != agent
                    else "launcher" if launcher is not None and not _alive(launcher) else None)
            if gone:
                _write_error(err_path, f"watchdog: the {gone} is gone; this rank exits")
                os._exit(WATCHDOG_EXIT)

    threading.Thread(target=watch, name="parbench-watchdog", daemon=True).start()


def _write_error(path: Path, line: str) -> None:
    """One error line into this rank's own error file, for the launcher's failure row."""
    try:
        with open(path, "a") as f:
            f.write(line.replace("\n", " ") + "\n")
    except OSError:
        pass


def main(argv: list[str] | None = None) -> int:
    plan: GroupPlan = spec.load(GroupPlan, Path((argv or sys.argv[1:])[0]).read_text())
    rank = int(os.environ["RANK"])
    err_path = Path(plan.events_prefix + f"-r{rank}.err")
    start_watchdog(err_path)
    try:
        return _main(plan)
    except BaseException as e:
        # The launcher names this line in the failure row (torchrun's own summary says only
        # "To enable traceback see ..."); the traceback still goes to the log.
        _write_error(err_path, one_line(e))
        raise


def _process_start() -> float | None:
    """When this process was created (unix time, to the clock tick), from its age in /proc: psutil's
    create_time adds the boot time in whole seconds, too coarse for a start-up split. None off Linux."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22, starttime
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return time.time() - (uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


def write_startup(path: Path, marks: dict[str, float | None]) -> None:
    """The leader's start-up marks (unix times: process created, Python, torch and the harness
    imported, device set, process group up, placement gathered, warm-up done) for the
    launcher's record of where a group's start-up goes (``meta.json`` ``group_starts``)."""
    try:
        path.write_text(json.dumps(marks))
    except OSError:
        pass


def _main(plan: GroupPlan) -> int:
    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    marks: dict[str, float | None] = {"process": _process_start(), "imported": _T_IMPORTED}
    backend = backends.get(plan.backend)
    if plan.device == "cuda":
        first = plan.cells[0].devices
        device = torch.device("cuda", first[local_rank] if plan.n_procs > 1 else first[0])
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = False  # fp32 cells are fp32, for parity
        torch.backends.cudnn.allow_tf32 = False
    else:
        device = torch.device("cpu")
    marks["device"] = time.time()
    kw: dict[str, Any] = {"timeout": timedelta(seconds=plan.pg_timeout_s)}
    if backend.bind_device:
        kw["device_id"] = device
    dist.init_process_group(backend.name, **kw)
    marks["process_group"] = time.time()
    from bench.multinode.netinfo import placement

    PLACE.update(placement(rank=rank, local_rank=local_rank, backend=plan.backend))
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, (rank, PLACE["node_rank"]))
    leader = rank == min(r for r, node in everyone if node == 0)
    events = Events(Path(plan.events_prefix + f"-r{rank}.jsonl"))
    extra = sorted({i for c in plan.cells for i in c.devices if c.n_procs == 1} - {device.index}) \
        if device.type == "cuda" and plan.n_procs == 1 else []
    precisions = {c.measure.precision for c in plan.cells}
    marks["placed"] = time.time()
    warm_group(device, "bf16" if "bf16" in precisions else "fp32", tuple(extra))
    marks["warm"] = time.time()
    if leader:
        write_startup(Path(plan.events_prefix + "-leader.startup.json"), marks)
    try:
        failed_cells: set[int] = set()
        settled_at: dict[int, int] = {}  # cell -> warm-up steps its first repeat took (for its profile pass)
        plan_rounds = rounds(plan)
        stop = False
        for r, order in enumerate(plan_rounds):
            stop = False
            for cell, repeat in order:
                if cell.cell_id in failed_cells:  # failed once: its later repeats are not run
                    continue
                if _past_deadline(plan):
                    # Past the run's deadline no new cell starts (its build and warm-up alone could
                    # overrun the budget).
                    if leader:
                        events.emit(spec.Stopped(reason="time budget: the deadline passed", t=time.time(),
                                                 rounds_done=r))
                    stop = True
                    break
                if leader:
                    events.emit(spec.Start(cell_id=cell.cell_id, t=time.time(), repeat=repeat))
                t0 = time.perf_counter()
                mine = run_cell(cell, plan, local_rank, first=repeat == 0)
                if mine.status != "ok":
                    events.emit(spec.Error(cell_id=cell.cell_id, rank=rank, reason=mine.reason, t=time.time()))
                per_rank: list[Any] = [None] * dist.get_world_size()
                dist.all_gather_object(per_rank, mine)
                if any(m.status != "ok" for m in per_rank):  # every rank sees the same list
                    failed_cells.add(cell.cell_id)
                if repeat == 0:
                    settled_at[cell.cell_id] = max(m.warmup_steps for m in per_rank)
                if leader:
                    events.emit(spec.Measured(cell_id=cell.cell_id, wall_s=time.perf_counter() - t0,
                                              ranks=per_rank, t=time.time(), repeat=repeat))
            if stop:
                break
        # The profile pass: every timed step of the group is done, so the profiler's after-effects
        # on these processes can no longer reach a measurement.
        for cell in [] if stop else [c for c in plan.cells if deferred(c) and c.cell_id not in failed_cells]:
            if _past_deadline(plan):
                if leader:
                    events.emit(spec.Stopped(reason="time budget: the deadline passed before the profile pass",
                                             t=time.time(), rounds_done=len(plan_rounds)))
                break
            if leader:
                events.emit(spec.Start(cell_id=cell.cell_id, t=time.time(), repeat=spec.PROFILE_PASS))
            t0 = time.perf_counter()
            mine = profile_cell(cell, plan, local_rank, settled_at.get(cell.cell_id, cell.measure.warmup))
            if mine.status != "ok":
                events.emit(spec.Error(cell_id=cell.cell_id, rank=rank, reason=f"profile pass: {mine.reason}",
                                       t=time.time()))
            per_rank = [None] * dist.get_world_size()
            dist.all_gather_object(per_rank, mine)
            if leader:
                events.emit(spec.Profiled(cell_id=cell.cell_id, wall_s=time.perf_counter() - t0, ranks=per_rank,
                                          t=time.time()))
    finally:
        # Without this, gloo can abort at interpreter exit: its run-loop thread frees work during
        # finalisation (seen in 2-11 of 20 runs on CPU; 0 of 20 with the explicit destroy).
        dist.destroy_process_group()
        gc.collect()
    return 0


if __name__ == "__main__":
    sys.exit(main())
