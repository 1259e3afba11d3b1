"""Inside one rank: one process group, the group's cells one after another, each isolated.

Started by the launcher (:class:`bench.train.group.GroupRun`) through torchrun as
``python -m bench.train.worker PLAN.json`` (a :class:`bench.core.spec.GroupPlan`). Each rank measures each cell into a
:class:`bench.core.spec.RankMeasurement`; the leader gathers them and sends them to the launcher as a
``measured`` event, where the row is built. The leader is the first rank of node 0 (on one node,
rank 0): on several nodes c10d assigns global ranks by node, not by --node-rank, and node 0's
launcher is the one that writes the tables. Any rank that fails reports an ``error`` event at once,
so the launcher can tell a failed cell from a hung one.

This module holds the rank's main loop and each cell's isolation (a failing cell is a row, and what
it leaves is freed before the next); the parts it drives live beside it: building a cell
(:mod:`bench.train.cell`), its timed steps (:mod:`bench.train.timed`), its profiled steps and the
profile pass (:mod:`bench.train.profile`), the order of the repeats (:mod:`bench.train.rounds`),
the events and error lines (:mod:`bench.train.events`) and the watchdog (:mod:`bench.train.watchdog`).
"""

from __future__ import annotations

import gc
import os
import sys
import time
import traceback
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

import strategies
from bench.core import backends, spec
from bench.core.metrics import BREAKDOWN_GAP_MAX
from bench.core.spec import CellSpec, GroupPlan, RankMeasurement, deferred
from bench.multinode.netinfo import placement
from bench.stats.steps import slowest_steps, timed_median
from bench.train.cell import PLACE, build, local_numel, release
from bench.train.events import Events, one_line, process_start, write_error, write_startup
from bench.train.profile import Built, profile_cell, profile_into
from bench.train.rounding import probes, rounding
from bench.train.rounds import rounds
from bench.train.timed import Steps, agreed, measure, past_deadline
from bench.train.watchdog import start_watchdog


def run_cell(cell: CellSpec, plan: GroupPlan, local_rank: int, *, first: bool = True) -> RankMeasurement:
    """Build, warm up to steady state, time until the interval target or a cap, profile (first
    repeat only); returns this rank's measurements (never raises)."""
    out = RankMeasurement(rank=dist.get_rank(), **PLACE)
    step = steps = None
    try:
        devices, device, batches, step, before = build(cell, local_rank, out)
        backend = backends.get(cell.backend)
        out.loss_weight = step.loss_weight
        steps = Steps(step, batches)
        measure(out, steps, cell, devices, before, backend, plan.deadline_unix)
        if first:  # profiling, evidence and the strategy's own metrics come from the first repeat
            _first_repeat(out, step, batches, cell, plan, device, backend)
    except Exception as e:  # noqa: BLE001 - a failing cell is a row, not a crash
        out.status, out.reason = "failed", one_line(e)
        if os.environ.get("PARBENCH_DEBUG"):
            traceback.print_exc()
    finally:
        step = steps = None  # drop the model before the next cell is built
        release(cell)
    return out


def _rounding(cell: CellSpec, local_rank: int, losses: list[float]) -> float | None:
    """The reference's rounding probe (:mod:`bench.train.rounding`); None where it fails: the
    cell's parity tolerance then stays at its precision's default, and the cell stays measured."""
    try:
        return rounding(cell, local_rank, losses)
    except Exception:  # noqa: BLE001 - the probe only widens a tolerance; its failure costs no row
        if os.environ.get("PARBENCH_DEBUG"):
            traceback.print_exc()
        return None


def _first_repeat(out: RankMeasurement, step, batches, cell: CellSpec, plan: GroupPlan, device: torch.device,
                  backend: backends.Backend) -> None:
    """What only a cell's first repeat adds to ``out``: its profiled steps, the parameter elements
    this rank holds, the strategy's own metrics and its self-parity."""
    # Profiled steps give the breakdown and the communication records; without them, or when
    # they are deferred to the group's profile pass (profile_at "end"), one step is profiled on
    # the CPU side only, for the distribution check's communication evidence.
    m = cell.measure
    tp = time.perf_counter()
    here = m.profile_steps > 0 and not deferred(cell)
    # The timed median this repeat's row will show (the slowest rank's step, every rank agreeing).
    target = timed_median([agreed(out.times, backend, device)[0]]) if here else None
    profile_into(out, Built(step, batches, cell, device, backend), plan, n=m.profile_steps if here else 1,
                 full=here, target_s=target)
    out.profile_s = time.perf_counter() - tp
    out.param_numel = local_numel(step.optimizer)
    if step.finish is not None:
        out.metrics.update(step.finish())
    if step.self_parity is not None:
        out.self_parity = step.self_parity()


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


@dataclass
class GroupLoop:
    """The rank's main loop over its group: the rounds of timed repeats, then the profile pass.
    Every rank writes its own errors; the leader alone writes the group's other events."""

    plan: GroupPlan
    rank: int
    local_rank: int
    leader: bool
    events: Events
    failed: set[int] = field(default_factory=set)  # cells that failed once: their later repeats are not run
    settled_at: dict[int, int] = field(default_factory=dict)  # cell -> warm-up steps its first repeat took
    timed: dict[int, list[np.ndarray]] = field(default_factory=dict)  # cell -> its repeats' slowest-rank steps

    def run(self) -> None:
        # The cell's earlier repeats (another launch's) count in the timed median its profile pass
        # is held to, as they do in its row; its pass warms up as long as its first repeat did.
        self.timed = {int(k): [np.asarray(s, dtype=float) for s in v] for k, v in self.plan.earlier.items()}
        self.settled_at = {int(k): v for k, v in self.plan.settled.items()}
        plan_rounds = rounds(self.plan)
        if self.timed_rounds(plan_rounds):
            self.profile_pass(rounds_done=len(plan_rounds))

    def timed_rounds(self, plan_rounds: list[list[tuple[CellSpec, int]]]) -> bool:
        """Every round's repeats in order; False when the deadline stops them."""
        for r, order in enumerate(plan_rounds):
            for cell, repeat in order:
                if cell.cell_id in self.failed:
                    continue
                if past_deadline(self.plan.deadline_unix):
                    # Past the run's deadline no new cell starts (its build and warm-up alone could
                    # overrun the budget).
                    self.announce(spec.Stopped(reason="time budget: the deadline passed", t=time.time(),
                                               rounds_done=r))
                    return False
                self.measure(cell, repeat)
        return True

    def measure(self, cell: CellSpec, repeat: int) -> None:
        """One timed repeat of ``cell`` on every rank, gathered into the leader's ``measured`` event."""
        self.announce(spec.Start(cell_id=cell.cell_id, t=time.time(), repeat=repeat))
        t0 = time.perf_counter()
        mine = run_cell(cell, self.plan, self.local_rank, first=repeat == 0)
        if repeat == 0 and mine.status == "ok" and probes(cell) and not past_deadline(self.plan.deadline_unix):
            # its own pass: the cell timeout counts again from its start, so a reference on a busy
            # machine is not cut for training its steps twice
            self.announce(spec.Start(cell_id=cell.cell_id, t=time.time(), repeat=spec.ROUNDING_PASS))
            mine.parity_rounding = _rounding(cell, self.local_rank, mine.losses)
        if mine.status != "ok":
            self.events.emit(spec.Error(cell_id=cell.cell_id, rank=self.rank, reason=mine.reason, t=time.time()))
        per_rank = self.gather(mine)
        if any(m.status != "ok" for m in per_rank):  # every rank sees the same list
            self.failed.add(cell.cell_id)
        if repeat == 0:
            self.settled_at[cell.cell_id] = max(m.warmup_steps for m in per_rank)
        if all(m.status == "ok" and m.times for m in per_rank):
            self.timed.setdefault(cell.cell_id, []).append(slowest_steps([m.times for m in per_rank]))
        self.announce(spec.Measured(cell_id=cell.cell_id, wall_s=time.perf_counter() - t0, ranks=per_rank,
                                    t=time.time(), repeat=repeat))

    def profile_pass(self, rounds_done: int) -> None:
        """The deferred cells' profiled steps. Every timed step of the group is done, so the
        profiler's after-effects on these processes can no longer reach a measurement."""
        for cell in [c for c in self.plan.cells if deferred(c) and c.cell_id not in self.failed and self.wants_pass(c)]:
            if past_deadline(self.plan.deadline_unix):
                self.announce(spec.Stopped(reason="time budget: the deadline passed before the profile pass",
                                           t=time.time(), rounds_done=rounds_done))
                break
            self.profile(cell)

    def wants_pass(self, cell: CellSpec) -> bool:
        """A cell measured again keeps the breakdown it has (GroupPlan.held, its profiled step)
        unless its new repeats moved the timed median further than BREAKDOWN_GAP_MAX from it; every
        rank decides alike (the same plan and gathered steps)."""
        held = self.plan.held.get(str(cell.cell_id))
        timed = self.timed.get(cell.cell_id)
        if held is None or not timed:
            return True
        return not abs(held / timed_median(timed) - 1) <= BREAKDOWN_GAP_MAX

    def profile(self, cell: CellSpec) -> None:
        """``cell``'s profile pass on every rank, gathered into the leader's ``profiled`` event."""
        self.announce(spec.Start(cell_id=cell.cell_id, t=time.time(), repeat=spec.PROFILE_PASS))
        t0 = time.perf_counter()
        timed = self.timed.get(cell.cell_id)
        mine = profile_cell(cell, self.plan, self.local_rank, self.settled_at.get(cell.cell_id, cell.measure.warmup),
                            target_s=timed_median(timed) if timed else None)
        if mine.status != "ok":
            self.events.emit(spec.Error(cell_id=cell.cell_id, rank=self.rank, reason=f"profile pass: {mine.reason}",
                                        t=time.time()))
        per_rank = self.gather(mine)
        self.announce(spec.Profiled(cell_id=cell.cell_id, wall_s=time.perf_counter() - t0, ranks=per_rank,
                                    t=time.time()))

    def gather(self, mine: RankMeasurement) -> list[Any]:
        per_rank: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(per_rank, mine)
        return per_rank

    def announce(self, event: spec.Event) -> None:
        if self.leader:
            self.events.emit(event)


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
        write_error(err_path, one_line(e))
        raise


def _set_device(plan: GroupPlan, local_rank: int) -> torch.device:
    """The device this rank's process works on: its planned GPU (TF32 off: fp32 cells are fp32,
    for parity), or the CPU."""
    if plan.device != "cuda":
        return torch.device("cpu")
    first = plan.cells[0].devices
    device = torch.device("cuda", first[local_rank] if plan.n_procs > 1 else first[0])
    torch.cuda.set_device(device)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    return device


def _init_group(backend: backends.Backend, device: torch.device, timeout_s: float) -> None:
    kw: dict[str, Any] = {"timeout": timedelta(seconds=timeout_s)}
    if backend.bind_device:
        kw["device_id"] = device
    dist.init_process_group(backend.name, **kw)


def _is_leader(rank: int, local_rank: int, backend: str) -> bool:
    """Find where this process runs (into PLACE); whether this rank is the first rank of node 0."""
    PLACE.update(placement(rank=rank, local_rank=local_rank, backend=backend))
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, (rank, PLACE["node_rank"]))
    return rank == min(r for r, node in everyone if node == 0)


def _warm(plan: GroupPlan, device: torch.device) -> None:
    """:func:`warm_group` in the cells' precision, on the GPUs the group's one-process cells drive."""
    extra = sorted({i for c in plan.cells for i in c.devices if c.n_procs == 1} - {device.index}) \
        if device.type == "cuda" and plan.n_procs == 1 else []
    precisions = {c.measure.precision for c in plan.cells}
    warm_group(device, "bf16" if "bf16" in precisions else "fp32", tuple(extra))


def import_for_cells(plan: GroupPlan) -> None:
    """Imports the modules of the plan's strategies, so that their imports count as start-up (which
    startup_timeout_s bounds) and not as the first cell's time (which cell_timeout_s bounds). A
    strategy that cannot load is left for its cell to report in its own row."""
    for name in dict.fromkeys(c.strategy_spec for c in plan.cells):
        try:
            strategies.get(name)
        except Exception:  # noqa: BLE001, S112
            continue


def _main(plan: GroupPlan) -> int:
    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    marks: dict[str, float | None] = {"process": process_start()}
    import_for_cells(plan)
    marks["imported"] = time.time()
    backend = backends.get(plan.backend)
    device = _set_device(plan, local_rank)
    marks["device"] = time.time()
    _init_group(backend, device, plan.pg_timeout_s)
    marks["process_group"] = time.time()
    leader = _is_leader(rank, local_rank, plan.backend)
    events = Events(Path(plan.events_prefix + f"-r{rank}.jsonl"))
    marks["placed"] = time.time()
    _warm(plan, device)
    marks["warm"] = time.time()
    if leader:
        write_startup(Path(plan.events_prefix + "-leader.startup.json"), marks)
    try:
        GroupLoop(plan, rank, local_rank, leader, events).run()
    finally:
        # Without this, gloo can abort at interpreter exit: its run-loop thread frees work during
        # finalisation (in 2-11 of 20 runs on CPU without the explicit destroy; 0 of 20 with it).
        dist.destroy_process_group()
        gc.collect()
    return 0


if __name__ == "__main__":
    from bench.runtime.ending import exit_with

    exit_with(main(), f"parbench rank {os.environ.get('RANK', '?')}")
