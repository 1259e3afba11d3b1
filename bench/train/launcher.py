"""Plan the matrix, group cells by (nodes, processes, backend), start torchrun once per group.

Inside a group one process group runs the cells one after another (``bench.train.worker``). The launcher
follows the workers' event files: measurements become a row at once (:func:`bench.results.rows.build_row`,
with the telemetry of the cell's window); a cell that raises is ``failed`` with its message; a cell
that outlives ``cell_timeout_s`` is ``timeout``, the group is stopped and relaunched with the cells
it had not run. Progress goes to a callback, so the caller decides how to show it.

One process tree per run, which dies with it: the launcher is the Linux child subreaper of its
descendants (a rank whose agent dies is re-parented to it, not to init); each launch's ranks are
captured while alive and found again by their plan file (:class:`ProcessTree`), so a timeout, a
signal or an exception kills all of them, and a process still alive after its launch ended is
killed and named in the row and in ``meta.json`` (``survivors``). Each rank also runs a watchdog
(:func:`bench.train.worker.start_watchdog`) that exits it when the launcher or its agent is gone, which
covers SIGKILL of the launcher. ``run(..., resume=RUN)`` runs only the cells RUN has no row for.

On several nodes (``--nnodes``) every node's launcher plans the same matrix; node 0 runs this module
as on one node, each group of several processes as a torchrun over every node (c10d rendezvous),
while the other nodes follow its commands (:mod:`bench.multinode`).
"""

from __future__ import annotations

import ctypes
import dataclasses
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import psutil

import strategies
from bench.core.errors import UserError
from bench.core import backends
from bench.core import spec
from bench.core.config import RunConfig, parse_workload
from bench.measure.hardware import cpu_threads, threads_per_rank
from bench.core.metrics import Metric, registry
from bench.results.store import RunWriter, cell_columns, new_run_id, write_meta
from bench.results.rows import build_row, failure_row, telemetry_means
from bench.core.spec import ONE_RANK_SKIP, CellSpec, GroupPlan, Measure, RankMeasurement, deferred
from bench.workloads import Workload, resolve

log = logging.getLogger("parbench")
STARTUP_S = 120.0  # torchrun + import torch + process group, before the first cell starts
#: A rank that fails a cell reports it and moves on to the harness's all-gather of the cell's
#: results; a peer still inside the cell may wait in a collective the failed rank will never join,
#: so the group is desynchronised and would sit until cell_timeout_s (300 s by default). When the
#: group has not finished the cell this long after a rank's error (at most half the cell timeout),
#: it is stopped, the cell fails with the earliest error, and the group is relaunched for the
#: cells it has left. A failure every rank hits at about the same time (a bad workload, an option
#: the model cannot take) finishes within the grace and costs no relaunch; ranks that fail more
#: than the grace apart cost one relaunch, never a wrong row.
ERROR_GRACE_S = 5.0
#: The launcher's pid, for the watchdog in every rank (bench.train.worker exits when it is gone).
LAUNCHER_ENV = "PARBENCH_LAUNCHER_PID"
PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h


@dataclass(frozen=True, kw_only=True)
class Planned:
    """A cell of the matrix: runnable (reason None) or skipped with its reason."""

    spec: CellSpec
    reason: str | None


@dataclass(kw_only=True)
class Group:
    n_procs: int
    backend: str
    cells: list[CellSpec] = field(default_factory=list)
    nnodes: int = 1

    @property
    def label(self) -> str:
        return f"{self.backend} x{self.n_procs}" + (f" on {self.nnodes} nodes" if self.nnodes > 1 else "")


@dataclass(frozen=True, kw_only=True)
class Progress:
    """What the launcher tells its caller: the plan (``n`` runnable cells), a group starts (``n``
    cells), a cell starts or is done."""

    kind: Literal["plan", "note", "group", "start", "done"]
    group: str
    cell: CellSpec | None = None
    n: int = 0
    status: str = ""
    text: str = ""


ProgressFn = Callable[[Progress], None]


def expand_strategies(specs: list[str]) -> list[tuple[str, strategies.Strategy]]:
    """(spec, strategy) for each asked strategy, 'all' expanded, duplicates dropped."""
    flat: list[str] = []
    for s in specs:
        flat.extend(strategies.names() if s == "all" else [s])
    out: dict[str, tuple[str, strategies.Strategy]] = {}
    for sp in flat:
        strat = strategies.get(sp)
        out.setdefault(strat.name, (sp, strat))
    return list(out.values())


def validate_options(given: dict[str, Any], strats: list[strategies.Strategy]) -> None:
    """Every ``--option`` key is declared by a strategy of the run and parses as its type."""
    declared = {o.name: o for s in strats for o in s.options}
    for key, value in given.items():
        if key not in declared:
            known = ", ".join(sorted(declared)) or "none (no strategy of this run takes options)"
            raise UserError(f"option {key!r} is not an option of the strategies in this run; known: {known}")
        try:
            declared[key].parse(value)
        except ValueError as e:
            raise UserError(str(e)) from None


def plan_devices(device: str, n_devices: int, nnodes: int = 1) -> tuple[int, ...]:
    """The CUDA indices a cell of ``n_devices`` runs on, on each of its ``nnodes`` nodes: the first
    n / nnodes visible GPUs (torchrun binds local rank r to the r-th); nothing else in the harness
    derives device ids."""
    return tuple(range(n_devices // nnodes)) if device == "cuda" else ()


def cell_nodes(cfg: RunConfig, n_procs: int) -> int:
    """Nodes a cell spans: one-process cells run on node 0 alone, the others on every node."""
    return cfg.nnodes if n_procs > 1 else 1


def profile_when(cfg: RunConfig) -> str:
    """When the cells' profiled steps run (``Measure.profile_at``): ``--profile-at auto`` is "end" on
    CUDA, where a GPU profiler session slows the process's later work (bench.train.worker.profile_cell),
    and "inline" on CPU, where there is no such effect to avoid and the pass's rebuild would only
    cost time."""
    if cfg.profile_at == "auto":
        return "end" if cfg.device == "cuda" else "inline"
    return cfg.profile_at


def plan(cfg: RunConfig, gpus: int) -> tuple[list[Planned], dict[str, Workload], list[Metric]]:
    """Every cell of the matrix, each runnable or skipped with its reason; the workloads by name;
    the run's column registry. A single-device reference cell is added for every workload: parity
    and scaling efficiency need it."""
    wls: dict[str, Workload] = {}
    parsed: list[tuple[Workload, str, dict[str, int]]] = []
    for text in cfg.workloads:
        name, dims = parse_workload(text)
        wl = resolve(name, seed=cfg.seed, global_batch=cfg.global_batch, **dims)
        if wl.name in wls:
            continue
        wls[wl.name] = wl
        parsed.append((wl, name, dims))
    strats = expand_strategies(cfg.strategies)
    if not any(s.name == "single" for _, s in strats):
        strats.insert(0, ("single", strategies.get("single")))
    validate_options(cfg.options, [s for _, s in strats])
    measure = Measure(steps=cfg.steps, warmup=cfg.warmup, profile_steps=cfg.profile_steps,
                      precision=cfg.effective_precision(), seed=cfg.seed, lr=cfg.lr, repeats=cfg.repeats,
                      warmup_max=cfg.warmup_max or 0, settle=cfg.settle, steps_max=cfg.steps_max or 0,
                      target_ci=cfg.target_ci, time_cap_s=cfg.time_cap_s, profile_at=profile_when(cfg))
    one_proc_backend = backends.for_one_process(cfg.device, cfg.backends)
    cells: list[Planned] = []
    seen: set[tuple] = set()
    weak = cfg.scaling == "weak"
    for wl, name, dims in parsed:
        base = wl.facts(name, dims)
        for sp, strat in strats:
            for backend in cfg.backends if not strat.one_process else [one_proc_backend]:
                # Weak scaling: the single-device reference runs every global batch a cell trains,
                # so that each cell has a parity reference of its own batch.
                sizes = (cfg.world_sizes if strat.name != "single"
                         else ([1] if not weak else sorted(set(cfg.world_sizes))))
                for n in sizes:
                    scale = n if weak else 1
                    facts = dataclasses.replace(base, global_batch=base.global_batch * scale)
                    n = 1 if strat.name == "single" else n
                    nodes = cell_nodes(cfg, strat.procs(n))
                    key = (wl.name, strat.name, backend, n, facts.global_batch)
                    if key in seen:
                        continue
                    seen.add(key)
                    reason = None
                    mine = {o.name for o in strat.options}
                    try:
                        options = strat.resolve_options(n, {k: v for k, v in cfg.options.items() if k in mine})
                    except ValueError as e:
                        options, reason = {}, str(e)
                    cell = CellSpec(cell_id=len(cells), workload=facts, strategy=strat.name, strategy_spec=sp,
                                    backend=backend, device=cfg.device, n_devices=n, n_procs=strat.procs(n),
                                    devices=plan_devices(cfg.device, n, nodes), options=options, labels={},
                                    role=strat.role, measure=measure, scaling=cfg.scaling, nnodes=nodes)
                    reason = reason or strat.check(cell, gpus=gpus)
                    if reason is None and strat.procs(n) == 1 and backend != one_proc_backend \
                            and one_proc_backend in cfg.backends:
                        reason = (f"{ONE_RANK_SKIP}: its {backend} cell would repeat the "
                                  f"{one_proc_backend} one, which is measured")
                    if reason is None and cfg.device == "cpu" and n // nodes > cpu_threads() * 4:
                        reason = f"{n // nodes} ranks per node > 4 x {cpu_threads()} CPU threads"
                    if reason is None:
                        cell = dataclasses.replace(cell, labels=strat.label_values(cell))
                    cells.append(Planned(spec=cell, reason=reason))
    metrics = registry(m for _, s in strats for m in s.columns())
    return cells, wls, metrics


def group(cells: list[Planned]) -> list[Group]:
    """Runnable cells grouped by (nodes, processes, backend), one-process groups first, the
    reference first in its group."""
    groups: dict[tuple[int, int, str], Group] = {}
    for p in cells:
        if p.reason is not None:
            continue
        c = p.spec
        groups.setdefault((c.n_procs, c.nnodes, c.backend),
                          Group(n_procs=c.n_procs, backend=c.backend, nnodes=c.nnodes)).cells.append(c)
    for g in groups.values():
        g.cells.sort(key=lambda c: (c.role != "reference", c.cell_id))
    first_backend = {c.spec.backend for c in cells if c.spec.role == "reference"}
    return [groups[k] for k in sorted(groups, key=lambda k: (k[0], k[1], k[2] not in first_backend, k[2]))]


#: What a budget plan assumes a torchrun group costs beyond its cells (start-up, the once-per-process
#: warm-up, teardown), by device: on 4 H100s the default matrix's groups took 21-25 s each from the
#: previous group's last cell to their first (seventh and eighth stops).
GROUP_START_S = {"cpu": 4.0, "cuda": 23.0}
#: What a cell costs beyond its timed steps (build, staging, 2 warm-up steps, one profiled step,
#: teardown): a base, keyed by (device, backend) ("multi-gpu": one process on several GPUs, as
#: DataParallel and layer splits are), plus seconds per billion parameters, since the steps and the
#: build grow with the model, and a share per extra rank, since a cell's barriers, gathers and
#: profiling wait for its slowest rank. Gloo's per-parameter term grows with its ring's traffic,
#: 2(n-1)/n of the gradients (its steps are its all-reduces over the host). Fitted on the default
#: matrix under its budget on 4 H100s (eighth stop, 160 cells, a cell's wall time less its timed
#: steps): NCCL 0.57 / 0.60 / 0.93 s a cell for the small models at 1 / 2 / 4 ranks and 2.0 / 2.6 /
#: 2.8 s for gpt-200m (236 M parameters); Gloo 0.74 / 1.05 s for the small models at 2 / 4 ranks,
#: 7.2 s for gpt-200m at 2; one-process multi-GPU cells 0.7-0.9 s and 2.9-3.2 s. The seventh stop's
#: model (no rank term) was 25-35% short at 2 and 4 ranks. The device's own entry covers any other
#: backend.
CELL_OVERHEAD_S = {"cpu": 1.0, "cuda": 0.6, ("cuda", "nccl"): 0.5, ("cuda", "gloo"): 0.6, ("cuda", "multi-gpu"): 0.7}
CELL_OVERHEAD_PER_RANK_S = {("cuda", "nccl"): 0.1, ("cuda", "gloo"): 0.15}
CELL_OVERHEAD_PER_BPARAM_S = {("cuda", "nccl"): 8.5, ("cuda", "gloo"): 6.0, ("cuda", "multi-gpu"): 10.0}
#: Gloo's extra seconds per billion parameters at 2(n-1)/n = 1 (two ranks)
GLOO_RING_PER_BPARAM_S = 21.0


def cell_overhead(device: str, backend: str, one_process_gpus: int = 1, params: int | None = None,
                  ranks: int = 1) -> float:
    """What a budget plan assumes one cell costs beyond its timed steps (``one_process_gpus``: the
    GPUs a one-process cell drives, as DataParallel and layer splits do; ``params``: the workload's
    parameter count, None when unknown; ``ranks``: the cell's processes)."""
    key = (device, "multi-gpu") if device == "cuda" and one_process_gpus > 1 else (device, backend)
    base = CELL_OVERHEAD_S.get(key, CELL_OVERHEAD_S[device]) + CELL_OVERHEAD_PER_RANK_S.get(key, 0.0) * (ranks - 1)
    per_b = CELL_OVERHEAD_PER_BPARAM_S.get(key, 0.0)
    if key == ("cuda", "gloo") and ranks > 1:
        per_b += GLOO_RING_PER_BPARAM_S * 2 * (ranks - 1) / ranks
    return base + per_b * (params or 0) / 1e9


#: A cell whose profiled steps run in its group's profile pass (``--profile-at end``) is built a
#: second time and warmed up again: its overhead above times this. On CPU (gpt-tiny, gloo x2: DDP
#: 0.45 s of pass against 0.58 s of other overhead, FSDP 0.70 against 0.90) the pass is about 0.75 of
#: the rest. On 4 H100s (twelfth stop, gpt-200m, 3 warm-up and 2 profiled steps, 3 runs each way) a
#: cell's wall time outside its timed steps was 1.61x (FSDP x4: 3.43 s against 2.12 s, medians) and
#: 1.72x (the single-GPU reference: 4.31 against 2.50) that of the same cell profiled inline; budget
#: plans run fewer warm-up and profiled steps, and the GPU model above ran 25% high in the ninth stop,
#: so 1.5 stays until a GPU run of the default matrix refits it.
PROFILE_PASS_FACTOR = 1.5


def _overhead(cfg, c: CellSpec) -> float:
    base = cell_overhead(cfg.device, c.backend, c.n_devices if c.n_procs == 1 else 1, c.workload.params,
                         ranks=c.n_procs)
    return base * (PROFILE_PASS_FACTOR if deferred(c) else 1.0)


def budget_plan(cfg: RunConfig, cells: list[Planned], budget_s: float) -> tuple[list[Planned], str]:
    """Fit the run into ``budget_s``: fewer repeats if needed, then each cell's timed steps capped
    by time (at least 2 steps, 2 warm-up and at most 1 profiled step; more timed steps while the
    interval is wide and time is left). The run's deadline cuts what still does not fit (those cells
    are skipped with that reason). Returns the cells with their new settings and the plan in one
    sentence; UserError when the fixed costs alone are far beyond the budget."""
    runnable = [p for p in cells if p.reason is None]
    if not runnable:
        return cells, "nothing to run"
    n_groups = len({(p.spec.n_procs, p.spec.nnodes, p.spec.backend) for p in runnable})
    fixed = n_groups * GROUP_START_S[cfg.device] + sum(_overhead(cfg, p.spec) for p in runnable)
    if fixed > 1.5 * budget_s:
        raise UserError(f"budget {budget_s:g}s is too small for {len(runnable)} cells in {n_groups} process groups "
                        f"(about {fixed:.0f}s before any timed step); raise --budget or narrow the matrix")
    usable = 0.8 * budget_s - fixed
    pinned = set(getattr(cfg, "pinned", ()) or ())  # the user's own settings stay as given
    repeats = cfg.repeats
    while "repeats" not in pinned and repeats > 1 and usable / (len(runnable) * repeats) < 0.5:
        repeats -= 1
    cap = max(usable / (len(runnable) * repeats), 0.1)
    if "time_cap_s" in pinned:
        cap = cfg.time_cap_s
    out = []
    for p in cells:
        m0 = p.spec.measure
        planned = dict(repeats=repeats, steps=min(m0.steps, 2), warmup=min(m0.warmup, 2),
                       steps_max=max(m0.steps_max, 500), warmup_max=min(m0.warmup_max, 10),
                       profile_steps=min(m0.profile_steps, 1), time_cap_s=cap)
        m = dataclasses.replace(m0, **{k: v for k, v in planned.items() if k not in pinned})
        out.append(dataclasses.replace(p, spec=dataclasses.replace(p.spec, measure=m)))
    least = min(p.spec.measure.steps for p in out if p.reason is None)
    stop = f"stops adding steps after {cap:.1f}s" if cap > 0 else "has no time cap (--time-cap 0)"
    if cfg.target_ci > 0:
        stop += f" (or when its interval is within {cfg.target_ci:.0%})"
    text = (f"budget {budget_s:g}s: {len(runnable)} cells x {repeats} repeat(s) in {n_groups} process group(s); "
            f"each repeat times at least {least} steps and {stop}; cells the deadline reaches are skipped"
            + (f"; repeats lowered from {cfg.repeats} to fit" if repeats < cfg.repeats else "")
            + (f"; kept as given: {', '.join(sorted(pinned))}" if pinned else "")
            + ("; tight: expect skipped cells" if usable <= 0 else ""))
    return out, text


class Pacer:
    """Re-plans a budgeted run's time cap before each process group from the time actually left.

    The plan's costs are a model (GROUP_START_S, CELL_OVERHEAD_S); a machine slower or faster than
    the one they were fitted on would end the run with cells skipped at the deadline, or with time
    unused. Before each group: the groups done so far give the pace (seconds they took over seconds
    the model gave them, 0.5-3), and 90% of the time remaining, divided by that pace, less the
    groups' modelled fixed costs, is shared among their cells' repeats as the cap (at least 0.1 s,
    at most twice the plan's). Dividing the whole by the pace charges it to the capped part too
    (warm-up may spend half a cap beyond the timed cap): a review's simulation of capped slots at
    1.5 x their cap overran a 600 s budget by 22 s when only the fixed costs were scaled. Off for
    runs on several nodes: not tested there."""

    def __init__(self, cfg: RunConfig, groups: list[Group]):
        self.cfg, self.groups = cfg, groups
        caps = [c.measure.time_cap_s for g in groups for c in g.cells if c.measure.time_cap_s]
        self.planned = max(caps) if caps else 0.0
        self.modelled = self.spent = 0.0
        self._start: tuple[float, float] | None = None  # (seconds left, modelled cost) of the current group

    def fixed(self, g: Group) -> float:
        return GROUP_START_S[self.cfg.device] + sum(_overhead(self.cfg, c) for c in g.cells)

    @staticmethod
    def slots(g: Group) -> int:
        """The group's measurements that each get a cap: every repeat of every cell."""
        return sum(c.measure.repeats for c in g.cells)

    @property
    def pace(self) -> float:
        return min(max(self.spent / self.modelled, 0.5), 3.0) if self.modelled > 0 else 1.0

    def cap(self, gid: int, left_s: float) -> float:
        rest = self.groups[gid:]
        slots = sum(self.slots(g) for g in rest)
        if not slots or not self.planned:
            return self.planned
        usable = 0.9 * left_s / self.pace - sum(self.fixed(g) for g in rest)
        return min(max(usable / slots, 0.1), 2 * self.planned)

    def next_group(self, gid: int, left_s: float) -> Group:
        g = self.groups[gid]
        cap = self.cap(gid, left_s)
        cells = [dataclasses.replace(c, measure=dataclasses.replace(c.measure, time_cap_s=cap))
                 if c.measure.time_cap_s else c for c in g.cells]
        self._start = (left_s, self.fixed(g) + self.slots(g) * cap)
        return dataclasses.replace(g, cells=cells)

    def group_done(self, left_s: float, clean: bool = True) -> None:
        """The group ended with ``left_s`` of the budget left. A group that was not ``clean`` (a
        launch killed at a cell's timeout, or after a desynchronised error) does not count towards the
        pace: its time is gone from the budget all the same, but a hang says nothing about how fast
        the machine runs the groups left, and counting it drove every later cap to the 0.1 s floor."""
        if self._start is not None:
            if clean:
                self.spent += self._start[0] - left_s
                self.modelled += self._start[1]
            self._start = None


def earliest(old: tuple[float, str] | None, new: tuple[float, str]) -> tuple[float, str]:
    """Of two (time, text) rank errors of one cell, the earlier (the first one on a tie)."""
    return new if old is None or new[0] < old[0] else old


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_env(nproc: int, node_rank: int = 0, share: int = 1) -> dict[str, str]:
    """The ranks' environment; ``share``: nodes of the run on this machine (their ranks split its
    cores)."""
    env = dict(os.environ)
    env["PARBENCH_NODE_RANK"] = str(node_rank)  # the worker's leader is the first rank of node 0
    # Workers import exactly what this process imports (the checkout, a user's workload module).
    env["PYTHONPATH"] = os.pathsep.join([p for p in sys.path if p] + [env.get("PYTHONPATH", "")])
    env.setdefault("OMP_NUM_THREADS", str(threads_per_rank(nproc * share)))
    for k, v in RANK_ENV_DEFAULTS.items():
        env.setdefault(k, v)
    env[LAUNCHER_ENV] = str(os.getpid())
    return env


#: Set in every rank unless the user's environment sets them (OMP_NUM_THREADS too, per launch: the
#: host's cores over its ranks). NCCL_NVLS_ENABLE=0: no NVLink multicast (it can take a shared host's
#: GPUs out of service). TORCH_NCCL_ASYNC_ERROR_HANDLING=1: a failed collective tears the rank down
#: instead of hanging it. TEARDOWN_CUPTI=1: Kineto detaches
#: CUPTI (cuptiFinalize) when a torch.profiler session ends. Without it the profiler's CUPTI
#: callbacks stay on for the life of the process (pytorch/pytorch#144455), and every cell measured
#: after a profiled one pays for them: on an H100 with torch 2.11, a launch-bound loop ran 1.95x
#: slower after one profiler session with CUDA activity (tools/baselines/profiler_aftereffect.py,
#: docs/RESULTS.md). The harness profiles each cell's first repeat in the processes that then
#: measure the group's later cells, so this default is what keeps those cells honest.
RANK_ENV_DEFAULTS = {"TEARDOWN_CUPTI": "1", "NCCL_NVLS_ENABLE": "0", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}


class EventReader:
    """Reads new, complete lines from every rank's event file of one launch, as typed events. Files
    are named by global rank (``PREFIX-r<rank>.jsonl``); on a node of a multi-node run its ranks
    are not 0..n-1, so the files are found by name."""

    def __init__(self, prefix: str, nproc: int = 0):
        self.prefix = prefix
        self.offsets: dict[Path, int] = {}

    def lines(self) -> list[str]:
        """New complete lines, as JSON text."""
        out: list[str] = []
        for p in sorted(Path(self.prefix).parent.glob(Path(self.prefix).name + "-r*.jsonl")):
            with open(p) as f:
                f.seek(self.offsets.get(p, 0))
                data = f.read()
            complete = data[: data.rfind("\n") + 1]
            self.offsets[p] = self.offsets.get(p, 0) + len(complete)
            out.extend(line for line in complete.splitlines() if line.strip())
        return out

    def poll(self) -> list[spec.Event]:
        return [spec.load_event(line) for line in self.lines()]


def torchrun_cmd(plan_path: str, nproc: int, *, nnodes: int = 1, endpoint: str | None = None,
                 rdzv_id: str = "", rdzv_timeout_s: float = 300.0, local_addr: str | None = None) -> list[str]:
    """The torchrun command of one launch: on one node a private loopback rendezvous; on several,
    torchrun's c10d rendezvous at ``endpoint``, whose store node 0's launcher hosts (is_host=0:
    no agent hosts it, so the store outlives each launch and agents of any node may start first)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={nnodes}", f"--nproc-per-node={nproc}"]
    if nnodes == 1:
        cmd += ["--master-addr=127.0.0.1", f"--master-port={free_port()}"]
    else:
        cmd += ["--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}", f"--rdzv-id={rdzv_id}",
                f"--rdzv-conf=is_host=0,join_timeout={max(int(rdzv_timeout_s), 1)}"]
        if local_addr:  # what the other nodes reach this one at (the host name may resolve to loopback)
            cmd.append(f"--local-addr={local_addr}")
    return cmd + ["--max-restarts=0", "-m", "bench.train.worker", plan_path]


def become_subreaper() -> bool:
    """Make this process the Linux child subreaper of its descendants: a rank whose torchrun agent
    dies is re-parented to the launcher (not to init), so the launcher can still find, kill and reap
    it. False where prctl is not available (other systems): the tree walk below still applies."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _describe(p: psutil.Process, cmds: dict[int, str] | None = None) -> str:
    """'pid N (bench.train.worker)' from the command line seen while it was alive."""
    cmd = (cmds or {}).get(p.pid)
    if cmd is None:
        try:
            cmd = " ".join(p.cmdline()[-3:])
        except psutil.Error:
            cmd = "?"
    return f"pid {p.pid} ({cmd})"


class ProcessTree:
    """Every process of one torchrun launch: the agent, and its ranks captured while they are
    alive (ranks run in sessions of their own, so the agent's process group does not reach them),
    plus any process whose command line names this launch's plan file (an orphaned rank)."""

    def __init__(self, proc: subprocess.Popen, plan_path: str):
        self.proc, self.plan_path = proc, plan_path
        self.known: dict[int, psutil.Process] = {}
        self.cmds: dict[int, str] = {}
        self._last = 0.0

    def refresh(self, every_s: float = 0.5) -> None:
        """Capture the agent's descendants (at most every ``every_s``: a /proc walk)."""
        if time.monotonic() - self._last < every_s:
            return
        self._last = time.monotonic()
        try:
            for c in psutil.Process(self.proc.pid).children(recursive=True):
                if c.pid not in self.known:
                    self.known[c.pid] = c
                    try:
                        self.cmds[c.pid] = "bench.train.worker" if "bench.train.worker" in c.cmdline() else c.name()
                    except psutil.Error:
                        pass
        except psutil.Error:
            pass

    def members(self) -> list[psutil.Process]:
        """The launch's processes other than the agent that are still running (zombies reaped)."""
        found = dict(self.known)
        for p in psutil.process_iter(["cmdline"]):
            cmd = p.info.get("cmdline") or []
            if p.pid != os.getpid() and any(self.plan_path in a for a in cmd):
                found.setdefault(p.pid, p)
        alive = []
        for pid, p in found.items():
            if pid == self.proc.pid:
                continue
            try:
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    alive.append(p)
                else:
                    _reap(p)
            except psutil.Error:
                continue
        return alive

    def kill(self, grace_s: float = 3.0) -> list[str]:
        """SIGTERM to the agent's group and every member, SIGKILL to what is left after
        ``grace_s``; returns the processes that had to be SIGKILLed."""
        self.refresh(0)
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(self.proc.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
            members = self.members()
            for p in members:
                try:
                    p.send_signal(sig)
                except psutil.Error:
                    pass
            try:
                self.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                pass
            _, left = psutil.wait_procs(members, timeout=grace_s if sig == signal.SIGTERM else 1.0)
            if self.proc.poll() is not None and not left:
                return [] if sig == signal.SIGTERM else [_describe(p, self.cmds) for p in members]
        return [_describe(p, self.cmds) for p in self.members()]

    def survivors(self, grace_s: float) -> list[str]:
        """After the agent exited: members still running ``grace_s`` later are killed and named."""
        left = self.members()
        if not left:
            return []
        _, left = psutil.wait_procs(left, timeout=grace_s)
        names = [_describe(p, self.cmds) for p in left]
        for p in left:
            try:
                p.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(left, timeout=2.0)
        return names


def _reap(p: psutil.Process) -> None:
    """Collect an adopted child that has exited (it would stay a zombie under a subreaper)."""
    try:
        os.waitpid(p.pid, os.WNOHANG)
    except (ChildProcessError, OSError):
        pass


#: torchrun lines that say nothing about the error (its own boilerplate)
_BOILERPLATE = re.compile(r"To enable traceback|error_file|traceback\s*:|torch.distributed.elastic|"
                          r"^\s*(time|host|rank|exitcode|root cause|failures|\[\d+\])\s*[:(]|^[=-]{5,}|"
                          r"ChildFailedError|^\*+$|^\s*<NO_OTHER_FAILURES>", re.IGNORECASE)


def exit_text(code: int | None) -> str:
    """'exit code 3' or 'signal 9 (SIGKILL)' for a process's return code."""
    if code is None:
        return "no exit code"
    if code < 0:
        try:
            return f"signal {-code} ({signal.Signals(-code).name})"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


def root_cause(log_text: str) -> tuple[int | None, int | None]:
    """(rank, exit code) of the first failure torchrun reports in its summary ("Root Cause"; its
    "Failures" list comes first and holds the ranks it stopped afterwards), if any."""
    i = log_text.rfind("Root Cause")
    log_text = log_text[i:] if i >= 0 else log_text
    rank = re.search(r"^\s*rank\s*:\s*(\d+)", log_text, re.MULTILINE)
    code = re.search(r"^\s*exitcode\s*:\s*(-?\d+)", log_text, re.MULTILINE)
    return (int(rank[1]) if rank else None), (int(code[1]) if code else None)


def rank_error(prefix: str, rank: int) -> str:
    """The last error line a rank wrote to its own error file (bench.train.worker writes it)."""
    try:
        lines = [ln.strip() for ln in Path(f"{prefix}-r{rank}.err").read_text(errors="replace").splitlines()]
    except OSError:
        return ""
    lines = [ln for ln in lines if ln]
    return lines[-1][:300] if lines else ""


def _log_tail(path: Path) -> str:
    """The last line of the torchrun log that looks like an error and is not torchrun's own."""
    try:
        lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    lines = [ln for ln in lines if not _BOILERPLATE.search(ln)]
    errs = [ln for ln in lines if re.search(r"(Error|Exception|error:|Killed|Aborted)", ln)]
    return (errs or lines or [""])[-1][:300]


def err_ranks(prefix: str) -> list[int]:
    """Global ranks of this launch that wrote an error file here."""
    out = []
    for p in Path(prefix).parent.glob(Path(prefix).name + "-r*.err"):
        tail = p.name[len(Path(prefix).name) + 2:-4]
        if tail.isdigit():
            out.append(int(tail))
    return sorted(out)


def crash_reason(prefix: str, logpath: Path, rc: int | None, n_procs: int = 0) -> str:
    """Which rank died, how (exit code or signal), and its last error line; the agent's own exit
    when no rank is named (the agent itself was killed)."""
    try:
        text = logpath.read_text(errors="replace")
    except OSError:
        text = ""
    rank, code = root_cause(text)
    if rank is None:
        errs = [(r, rank_error(prefix, r)) for r in err_ranks(prefix)]
        errs = [(r, e) for r, e in errs if e]
        if errs:
            r, e = errs[0]
            return f"torchrun exited with {exit_text(rc)}; rank {r}: {e}"
        tail = _log_tail(logpath)
        return f"torchrun exited with {exit_text(rc)}" + (f": {tail}" if tail else "")
    line = rank_error(prefix, rank)
    if not line:  # a rank killed by a signal writes nothing: its peers' lines say what they saw
        others = [(r, rank_error(prefix, r)) for r in err_ranks(prefix) if r != rank]
        seen = [f"rank {r}: {e}" for r, e in others if e]
        line = f"no error line from it; {seen[0]}" if seen else "no error line from it"
    return f"rank {rank} exited with {exit_text(code)}: {line}"


class Telemetry:
    """The launcher's view of the sampler: new rows since the last cell, appended per cell. On a
    multi-node run, ``remote`` returns the rows the other nodes shipped (each with its ``node``)."""

    def __init__(self, sampler, writer: RunWriter, remote: Callable[[], list[dict[str, Any]]] | None = None):
        self.sampler, self.writer, self.remote = sampler, writer, remote
        self.pending: list[dict[str, Any]] = []

    def take(self) -> list[dict[str, Any]]:
        """Samples since the last call (also kept for the cell's telemetry window)."""
        if self.sampler is None:
            return []
        self.pending = [{**r, "node": 0} for r in self.sampler.drain()]
        if self.remote is not None:
            self.pending += self.remote()
        return self.pending

    def flush(self) -> None:
        self.writer.append("samples", self.pending)
        self.pending = []


@dataclass(kw_only=True)
class Pending:
    """What the launcher holds of a cell until its last repeat arrives."""

    spec: CellSpec
    repeats: list[list[RankMeasurement]] = field(default_factory=list)
    telemetry: list[dict[str, float]] = field(default_factory=list)
    wall_s: float = 0.0

    def timed(self) -> bool:
        """Every planned repeat is in (only a deferred profile pass may be left)."""
        return len(self.repeats) >= self.spec.measure.repeats

    def merge_profile(self, ev: spec.Profiled) -> str:
        """The profile pass's breakdown and records into the first repeat; '' or why it failed."""
        self.wall_s += ev.wall_s
        bad = [r for r in ev.ranks if r.status != "ok"]
        if bad:
            first = min(bad, key=lambda r: r.rank)
            return f"profile pass failed on rank {first.rank}: {first.reason}"
        mine = {r.rank: r for r in ev.ranks}
        for r in self.repeats[0] if self.repeats else []:
            got = mine.get(r.rank)
            if got is not None:
                r.breakdown, r.comm, r.profile_s = got.breakdown, got.comm, r.profile_s + got.profile_s
                if got.comm_calls_per_step is not None:
                    r.comm_calls_per_step, r.comm_bytes_per_step = got.comm_calls_per_step, got.comm_bytes_per_step
        return ""


def run_group(g: Group, gid: int | str, cfg: RunConfig, writer: RunWriter, work: Path, telemetry: Telemetry,
              on_progress: ProgressFn, trace_dir: Path | None, deadline_unix: float | None = None,
              survivors: list[str] | None = None, coord=None, starts: list[dict[str, Any]] | None = None) -> bool:
    """Run a group's cells (all their repeats, in rounds), relaunching after a timeout or a crash,
    until every cell has a row. Processes of a launch still alive when it ended are killed and
    named in ``survivors`` (and in the reason of the cell that was running). A group on several
    nodes is launched on every node through ``coord`` (:class:`bench.multinode.nodes.Coordinator`);
    the other nodes' rank errors and crash reasons count as this node's, and a node that stops
    answering fails the cell that was running and every later cell of the group. Each launch's
    start-up and teardown, split into phases (:func:`startup_record`), is appended to ``starts``.
    Returns False when a launch of the group had to be killed (the budget's pacer leaves it out of
    its pace)."""
    survivors = survivors if survivors is not None else []
    pending = {c.cell_id: Pending(spec=c) for c in g.cells}
    attempt = 0
    clean = True  # no launch of the group was killed (a timeout, a desynchronised error, a lost node)

    def finish(p: Pending, status: str | None = None, reason: str = "", profile_note: str = "") -> None:
        c = p.spec
        if status is None:
            cls = type(strategies.get(c.strategy_spec))
            row, steps, comm = build_row(c, p.repeats, wall_s=p.wall_s, strategy_metrics=cls.metrics,
                                         expects=cls.distributes, telemetry=p.telemetry)
            if profile_note and row.get("status") == "ok":
                row["profile_note"] = profile_note
        else:
            row, steps, comm = failure_row(c, status=status, reason=reason), [], []
        writer.add(row, steps, comm)
        del pending[c.cell_id]
        on_progress(Progress(kind="done", group=g.label, cell=c, status=row["status"]))

    launch_notes: list[str] = []

    def note(text: str) -> None:
        survivors.append(text)
        launch_notes.append(text)
        log.warning(text)

    multi = g.nnodes > 1 and coord is not None
    while pending:
        attempt += 1
        launch_notes.clear()
        gone = coord.lost() if multi else {}
        if gone:
            why = "; ".join(f"node {r}: {w}" for r, w in sorted(gone.items()))
            for p in list(pending.values()):
                finish(p, "failed", f"a node of the run is gone ({why}); nothing ran on {g.nnodes} nodes after that")
            return False
        prefix = str(work / f"g{gid}-a{attempt}")
        gplan = GroupPlan(backend=g.backend, device=cfg.device, n_procs=g.n_procs, events_prefix=prefix,
                          pg_timeout_s=cfg.cell_timeout_s, trace_dir=str(trace_dir) if trace_dir else None,
                          cells=tuple(p.spec for p in pending.values()),
                          first_repeat={str(k): len(p.repeats) for k, p in pending.items() if p.repeats},
                          deadline_unix=deadline_unix)
        Path(prefix + ".json").write_text(spec.dump(gplan))
        nproc = g.n_procs // g.nnodes
        seq = -1
        if multi:
            rdzv_id = f"{writer.run_id}-g{gid}-a{attempt}"
            seq = coord.launch(gplan, rdzv_id=rdzv_id, nproc_per_node=nproc)
            cmd = torchrun_cmd(prefix + ".json", nproc, nnodes=g.nnodes, endpoint=cfg.rdzv_endpoint, rdzv_id=rdzv_id,
                               rdzv_timeout_s=cfg.rdzv_timeout_s, local_addr=coord.me["local_addr"])
        else:
            cmd = torchrun_cmd(prefix + ".json", nproc)
        logpath = Path(prefix + ".log")
        launched = time.time()
        marks: dict[str, float | None] = {"first_cell": None, "last_cell": None, "exited": None}
        with open(logpath, "w") as logf:
            proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT,
                                    env=child_env(nproc, share=coord.share if multi else 1), start_new_session=True)
        tree = ProcessTree(proc, prefix + ".json")
        reader = EventReader(prefix)
        current: CellSpec | None = None
        errors: dict[int, tuple[float, str]] = {}  # cell -> (when, "rank R: reason") of its first error
        desync_at: float | None = None  # when to stop a group still inside a cell that a rank failed
        grace_s = min(ERROR_GRACE_S, cfg.cell_timeout_s / 2)
        started_any = stopped = False
        in_pass = False  # the worker reached the profile pass (every timed repeat of the launch is in)
        # On several nodes the rendezvous may wait for the other nodes' agents to start.
        deadline = time.monotonic() + STARTUP_S + cfg.cell_timeout_s + (cfg.rdzv_timeout_s if multi else 0)
        timed_out = False
        lost: dict[int, str] = {}
        last_remote = 0.0

        def handle(ev: spec.Event) -> None:
            """One event of a rank: a cell starts, fails on a rank, or is measured (its row)."""
            nonlocal current, started_any, stopped, deadline, desync_at, in_pass
            if isinstance(ev, spec.Stopped):
                stopped = True
                return
            p = pending.get(ev.cell_id)
            if p is None:
                return
            if isinstance(ev, spec.Start) and ev.repeat == spec.PROFILE_PASS:
                current, deadline, in_pass = p.spec, time.monotonic() + cfg.cell_timeout_s, True
            elif isinstance(ev, spec.Profiled):
                telemetry.take()
                telemetry.flush()
                marks["last_cell"] = time.time()  # teardown starts after the last pass
                current, desync_at = None, None
                deadline = time.monotonic() + cfg.cell_timeout_s
                errors.pop(p.spec.cell_id, None)  # a failed pass is the row's note, not the cell's failure
                finish(p, profile_note=p.merge_profile(ev))
            elif isinstance(ev, spec.Start):
                marks["first_cell"] = marks["first_cell"] or time.time()
                current, started_any = p.spec, True
                deadline = time.monotonic() + cfg.cell_timeout_s
                on_progress(Progress(kind="start", group=g.label, cell=p.spec))
            elif isinstance(ev, spec.Error):
                # The earliest error is the cause; a peer's later one is usually its consequence.
                # (Across nodes the stamps are each host's wall clock: skew can reorder errors that
                # came within it of each other.)
                errors[p.spec.cell_id] = earliest(errors.get(p.spec.cell_id), (ev.t, f"rank {ev.rank}: {ev.reason}"))
                if g.n_procs > 1 and desync_at is None:
                    desync_at = time.monotonic() + grace_s
            elif isinstance(ev, spec.Measured):
                samples = telemetry.take()
                window = ev.ranks[0].window if ev.ranks and ev.ranks[0].window else None
                p.telemetry.append(telemetry_means(samples, p.spec, window) if window else {})
                telemetry.flush()
                p.repeats.append(ev.ranks)
                marks["last_cell"] = time.time()
                p.wall_s += ev.wall_s
                current, desync_at = None, None
                deadline = time.monotonic() + cfg.cell_timeout_s
                failed = any(r.status != "ok" for r in ev.ranks)
                if failed or (p.timed() and not deferred(p.spec)):
                    finish(p)

        queue: list[spec.Event] = []  # read but not yet handled: a signal between the two must not lose them
        _IN_GROUP[0] = True
        try:
            while True:
                _check_stop()
                tree.refresh()
                exited = proc.poll() is not None
                queue.extend(reader.poll())
                if multi and (exited or time.monotonic() - last_remote > 0.25):
                    last_remote = time.monotonic()
                    queue.extend(coord.events(seq))  # the other nodes' ranks' errors
                    lost = coord.lost()
                while queue:
                    handle(queue[0])
                    queue.pop(0)
                if exited:
                    marks["exited"] = time.time()
                    break
                if lost:
                    note(f"{g.label} attempt {attempt}: " + "; ".join(f"node {r} stopped answering ({w})"
                                                                     for r, w in sorted(lost.items())))
                    tree.kill()
                    clean = False
                    break
                if desync_at is not None and time.monotonic() > desync_at:
                    note(f"{g.label} attempt {attempt}: after a rank's error the other ranks had not finished the "
                         f"cell {grace_s:g}s later (desynchronised): group stopped"
                         + ("" if len(pending) <= 1 else " and relaunched for its remaining cells"))
                    tree.kill()
                    clean = False
                    break
                if time.monotonic() > deadline:
                    timed_out, clean = True, False
                    left = tree.kill()
                    if left:  # ignored SIGTERM: worth knowing, its CPU time skewed the cell
                        note(f"{g.label} attempt {attempt}: killed with SIGKILL after ignoring SIGTERM: "
                             + ", ".join(left))
                    break
                time.sleep(0.05)
        except BaseException as stop:
            if isinstance(stop, KeyboardInterrupt):
                # A cell measured just before the signal is finished: its row must not be lost.
                try:
                    for ev in [*queue, *reader.poll()]:
                        if isinstance(ev, spec.Measured | spec.Profiled):
                            handle(ev)
                    # every timed repeat in, its profile pass not: the timing is the row
                    for p in [p for p in pending.values() if p.timed()]:
                        finish(p, profile_note="profile pass not run: the run was stopped")
                except Exception as e:  # noqa: BLE001 - stopping anyway; the kill below matters more
                    log.warning("last events not recorded: %s", e)
            tree.kill(grace_s=1.0)
            raise
        finally:
            _IN_GROUP[0] = False
            remote = coord.finish_launch(seq) if multi else {}
        if starts is not None:
            starts.append(startup_record(g.label, attempt, launched, marks, Path(prefix)))
        # No process of this launch may outlive it (a rank that lost its agent would run on beside
        # the next launch and skew its times): a survivor is killed and named.
        left = tree.survivors(grace_s=2.0 if proc.returncode else 0.5)
        if left:
            note(f"{g.label} attempt {attempt}: still running after torchrun exited, killed: " + ", ".join(left))
        for r, info in sorted(remote.items()):
            if info.get("survivors"):
                note(f"{g.label} attempt {attempt}: node {r}: still running after torchrun exited, killed: "
                     + ", ".join(info["survivors"]))
        if stopped or (proc.returncode == 0 and not timed_out):
            # The worker ended its rounds (the time budget) or finished: cells keep the repeats they got.
            for p in list(pending.values()):
                if p.repeats:
                    finish(p, profile_note="profile pass not run: "
                           + ("the time budget's deadline passed" if stopped else "the group ended without it")
                           if deferred(p.spec) else "")
                else:
                    finish(p, "skipped", "time budget: the run's deadline passed before this cell's turn")
            continue
        if not pending:
            continue
        # Killed or crashed in the profile pass: the cell whose pass was running keeps its timing with a
        # note; the other cells' passes run in the relaunch (their timed repeats are all in, so the
        # relaunch's rounds skip them). Killed before the pass (a hang or crash in another cell's timed
        # repeat): cells already timed wait for the relaunch's pass, and are never the victim.
        done = [p for p in pending.values() if p.timed()]
        if in_pass or (done and not started_any):
            why = ("no result within cell_timeout_s" if timed_out
                   else crash_reason(prefix, logpath, proc.returncode, g.n_procs))
            if launch_notes:
                why += "; " + "; ".join(launch_notes)
            hit = [p for p in done if current is not None and p.spec.cell_id == current.cell_id] or done
            for p in hit:
                err = errors.get(p.spec.cell_id)
                finish(p, profile_note=f"profile pass {'did not finish' if in_pass else 'did not run'}: "
                                       f"{err[1] if err else why}")
            if in_pass or not pending:
                continue
        rc = proc.returncode
        # Who gets the blame: the cell that was running; if none had started, every remaining cell
        # (the group itself could not start) -- never loop forever.
        victims = [current] if current is not None else ([] if started_any else [p.spec for p in pending.values()])
        if not victims:
            victims = [next(iter(pending.values())).spec]
        for v in victims:
            if v.cell_id in errors:
                status, reason = "failed", errors[v.cell_id][1]
            elif timed_out:
                status = "timeout"
                reason = (f"no result within cell_timeout_s={cfg.cell_timeout_s:g}s; group relaunched"
                          if started_any else f"group did not start within {STARTUP_S + cfg.cell_timeout_s:g}s")
            else:
                status = "failed"
                reason = crash_reason(prefix, logpath, rc, g.n_procs)
                # The root cause may be on another node (its rank died; this node's peers only saw
                # the connection close): its own reason comes first when it has one.
                theirs = [f"node {r}: {i['reason']}" for r, i in sorted(remote.items()) if i.get("reason")]
                if theirs:
                    reason = "; ".join(theirs) + f"; node 0: {reason}"
            gone = coord.lost() if multi else {}
            if gone and not lost:  # seen after the launch ended (its ranks saw only a closed connection)
                reason += "; " + "; ".join(f"node {r} stopped answering ({w})" for r, w in sorted(gone.items()))
            if launch_notes:
                reason += "; " + "; ".join(launch_notes)
            telemetry.take()
            telemetry.flush()
            finish(pending[v.cell_id], status, reason)
    return clean


def startup_record(label: str, attempt: int, launched: float, marks: dict[str, float | None],
                   prefix: Path) -> dict[str, Any]:
    """Where one launch's time outside its cells went, in seconds: from the launcher's Popen to the
    leader's process (torchrun's own start-up), its interpreter and imports, device, process group,
    placement and warm-up (the leader's marks, :func:`bench.train.worker.write_startup`), then to the first
    cell's start; and from the last measured cell to torchrun's exit (teardown). The launcher's own
    work between two launches is the next one's ``launched_unix`` less this one's ``exited_unix``. A
    phase whose marks are missing (a launch that failed early) is left out."""
    rec: dict[str, Any] = {"group": label, "attempt": attempt, "launched_unix": round(launched, 3),
                           "exited_unix": round(marks["exited"], 3) if marks.get("exited") else None}
    try:
        worker = json.loads(Path(str(prefix) + "-leader.startup.json").read_text())
    except (OSError, ValueError):
        worker = {}
    at = {"launched": launched, **{k: worker.get(k) for k in ("process", "imported", "device", "process_group",
                                                             "placed", "warm")}, "first_cell": marks.get("first_cell")}
    # each phase between two marks, and only when both exist (a missing mark leaves its phases out
    # rather than folding them into a neighbour)
    for name, a, b in (("torchrun_s", "launched", "process"), ("imports_s", "process", "imported"),
                       ("device_s", "imported", "device"), ("process_group_s", "device", "process_group"),
                       ("placement_s", "process_group", "placed"), ("warm_up_s", "placed", "warm"),
                       ("to_first_cell_s", "warm", "first_cell")):
        if at.get(a) is not None and at.get(b) is not None:
            rec[name] = round(float(at[b]) - float(at[a]), 3)  # type: ignore[arg-type]
    if marks.get("first_cell") is not None:
        rec["start_s"] = round(float(marks["first_cell"]) - launched, 3)  # type: ignore[arg-type]
    if marks.get("last_cell") is not None and marks.get("exited") is not None:
        rec["teardown_s"] = round(float(marks["exited"]) - float(marks["last_cell"]), 3)  # type: ignore[arg-type]
    return rec


class Interrupted(KeyboardInterrupt):
    """The run was stopped by a signal (SIGINT, SIGTERM, SIGHUP): cleaned up like Ctrl-C."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


#: While a group runs, a stop signal is only noted here and raised by the group's loop at a safe
#: point (between reading events and handling them a raise could lose a finished cell's row).
_STOP: list[int] = []
_IN_GROUP: list[bool] = [False]


def request_stop(signum: int) -> bool:
    """Note a stop signal; True if a group's loop will raise it within 50 ms, False if the caller
    must raise it now."""
    _STOP.append(signum)
    return _IN_GROUP[0]


def _check_stop() -> None:
    if _STOP:
        raise Interrupted(_STOP[0])


def check_out(out: str) -> None:
    """The results folder can be created and written, before anything launches; a one-line
    UserError naming the value and the fix otherwise."""
    p = Path(out)
    for part in p.parts:
        if len(os.fsencode(part)) > 255:
            raise UserError(f"--out {out[:40]!r}...: the name {part[:20]!r}... is {len(os.fsencode(part))} bytes, over "
                            "the file system's 255; pass a shorter folder name")
    from bench.core.paths import folder_problem

    why = folder_problem(p)
    if why == "it is a file":
        raise UserError(f"--out {out!r} is a file, not a folder; pass a folder, e.g. --out results")
    if why:
        raise UserError(f"--out {out!r} is not writable ({why}); pass a folder you can write to")


def finished_cells(run_dir: Path) -> set[int]:
    """cell_ids that already have a row in a run folder (any status: a row is final)."""
    from bench.results.store import read_table

    cells = read_table(run_dir, "cells")
    if cells.empty or "cell_id" not in cells:
        return set()
    return {int(c) for c in cells["cell_id"].dropna()}


def _open_run(cfg: RunConfig, metrics: list[Metric], resume: Path | None) -> tuple[Path, RunWriter, Path, set[int]]:
    """(run folder, writer, work folder, cell_ids already done): a new run, or the folder of a run
    to resume (appended to; its earlier work files kept)."""
    if resume is None:
        check_out(cfg.out)
        run_dir = Path(cfg.out) / new_run_id()
        writer = RunWriter(run_dir, cell_schema=cell_columns(metrics))
        work = run_dir / "work"
        work.mkdir()
        return run_dir, writer, work, set()
    run_dir = Path(resume)
    done = finished_cells(run_dir)
    writer = RunWriter(run_dir, cell_schema=cell_columns(metrics), resume=True)
    n = 1 + sum(1 for _ in (run_dir / "work").glob("resume*"))
    work = run_dir / "work" / f"resume{n}"
    work.mkdir(parents=True)
    set_aside_orphans(run_dir, done, work / "orphans")
    return run_dir, writer, work, done


def set_aside_orphans(run_dir: Path, done: set[int], to: Path) -> list[Path]:
    """Steps and comm parts of cells that have no row (the run was killed between a cell's parts
    and its row) move to ``to``: the cell runs again, and its rows must not appear twice."""
    import pyarrow.parquet as pq

    moved = []
    for table in ("steps", "comm"):
        for part in sorted((run_dir / f"{table}.parquet").glob("part-*.parquet")):
            try:
                ids = set(pq.read_table(part, columns=["cell_id"]).column("cell_id").to_pylist())
            except Exception:  # noqa: BLE001 - an unreadable part is read_table's to report, by name
                continue
            if ids and not ids & done:
                to.mkdir(parents=True, exist_ok=True)
                dest = to / f"{table}-{part.name}"
                os.replace(part, dest)
                moved.append(dest)
    return moved


def run(cfg: RunConfig, gpus: int, *, on_progress: ProgressFn | None = None, resume: Path | None = None) -> Path:
    """Run the whole matrix (or, with ``resume``, the cells that run folder has no row for, appended
    to it); returns the run folder. Rows land on disk as cells finish.

    With ``cfg.nnodes > 1`` node 0 does this, hosting the rendezvous and waiting for the other
    nodes to join with the same plan first; another node follows node 0 instead
    (:func:`bench.multinode.follow.follow`) and returns its own work folder (the tables are on
    node 0)."""
    _STOP.clear()  # a signal noted by an earlier run in this process is not this run's
    invoked = time.time()  # this invocation's start (a resumed run keeps the first one's created_utc)
    cells, wls, metrics = plan(cfg, gpus)
    from bench.core.config import parse_duration

    budget_s = parse_duration(cfg.budget) if cfg.budget else None
    plan_text = ""
    if budget_s is not None:
        cells, plan_text = budget_plan(cfg, cells, budget_s)
    coord = None
    if cfg.nnodes > 1:
        from bench.multinode import plan_digest

        if resume is not None:
            raise UserError("--resume of a run on several nodes is not supported; run it again")
        if cfg.node_rank > 0:
            from bench.multinode.follow import follow

            check_out(cfg.out)
            return follow(cfg, plan_digest(cells), len(cells), on_progress=on_progress)
        from bench.multinode.nodes import Coordinator

        check_out(cfg.out)
        coord = Coordinator(cfg, plan_digest(cells), len(cells))
        coord.wait_joined()
    try:
        run_dir, writer, work, done = _open_run(cfg, metrics, resume)
    except BaseException:
        if coord is not None:
            coord.close("failed")
        raise
    if coord is not None:
        coord.accept(run_dir)
    become_subreaper()
    cells = [p for p in cells if p.spec.cell_id not in done]
    trace_dir = run_dir / "traces" if cfg.trace else None
    if trace_dir:
        trace_dir.mkdir(exist_ok=True)
    described = {n: w.description for n, w in wls.items()}
    extra: dict[str, Any] = {"resumed": sorted(done)} if resume is not None else {}
    starts: list[dict[str, Any]] = []
    if resume is not None:  # the interrupted run's launches stay on record, before this one's
        try:
            starts.extend(json.loads((run_dir / "meta.json").read_text()).get("group_starts") or [])
        except (OSError, ValueError):
            pass
    extra["group_starts"] = starts  # filled as the groups run; written with the final meta.json
    extra["invoked_unix"] = round(invoked, 3)
    if coord is not None:
        extra["nodes"] = [{"node": r, **{k: v for k, v in n.items() if k in ("host", "addr", "iface")}}
                          for r, n in sorted(coord.nodes.items())]
    write_meta(run_dir, cfg.to_dict(), workloads=described, plan=plan_text, status="running", **extra)
    from bench.measure.telemetry import start_samplers

    sampler, notes = start_samplers(cfg.sample_hz, gpu=cfg.device == "cuda")
    telemetry = Telemetry(sampler, writer, remote=coord.samples if coord is not None else None)
    survivors: list[str] = []
    status = "failed"  # what meta.json says if something unforeseen stops the run
    try:
        writer.append("cells", [failure_row(p.spec, status="skipped", reason=p.reason)
                                for p in cells if p.reason is not None])
        groups = group(cells)
        report = on_progress or (lambda _p: None)
        report(Progress(kind="plan", group="", n=runnable(cells)))
        if plan_text:
            report(Progress(kind="note", group="", text=plan_text))
        deadline = time.time() + budget_s if budget_s else None
        pacer = (Pacer(cfg, groups) if budget_s and cfg.nnodes == 1
                 and "time_cap_s" not in (getattr(cfg, "pinned", ()) or ()) else None)
        for gid, g in enumerate(groups):
            if pacer is not None:
                g = pacer.next_group(gid, deadline - time.time())
            # A group that cannot even start and build its cells before the deadline is not started.
            needed = GROUP_START_S[cfg.device] + sum(_overhead(cfg, c) for c in g.cells[:3])
            if deadline is not None and time.time() + needed > deadline:
                for c in g.cells:
                    writer.add(failure_row(c, status="skipped", reason="time budget: the run's deadline passed "
                                                                     "before this cell's group"))
                    report(Progress(kind="done", group=g.label, cell=c, status="skipped"))
                continue
            report(Progress(kind="group", group=g.label, n=len(g.cells)))
            clean = run_group(g, gid, cfg, writer, work, telemetry, report, trace_dir, deadline, survivors,
                              coord=coord, starts=starts)
            if pacer is not None:
                pacer.group_done(deadline - time.time(), clean=clean is not False)
        status = "complete"
    except Interrupted as e:
        status = f"interrupted by {signal.Signals(e.signum).name}"
        e.run_dir = run_dir  # the command's message names the folder to resume
        raise
    except KeyboardInterrupt as e:
        status = "interrupted by SIGINT"
        e.run_dir = run_dir  # type: ignore[attr-defined]
        raise
    except UserError as e:
        status = f"stopped: {e}"
        raise
    finally:
        _finish_meta(run_dir, cfg, sampler, notes, telemetry, described=described, plan=plan_text, status=status,
                     survivors=survivors, **extra)
        if coord is not None:
            coord.close(status)
    # One part per table from here on (reading a long run's thousands of parts costs seconds);
    # only after a complete run: an interrupted one keeps its parts for --resume.
    if not os.environ.get("PARBENCH_KEEP_PARTS"):
        writer.compact()
    return run_dir


def _finish_meta(run_dir: Path, cfg: RunConfig, sampler, notes: dict, telemetry: Telemetry, **more: Any) -> None:
    """Stop the sampler and write the final meta.json; a full disk here must not hide the error
    that stopped the run (it is logged instead)."""
    try:
        if sampler is not None:
            sampler.stop()
            notes.update(sampler.notes())
            telemetry.take()
            telemetry.flush()
    except (OSError, UserError) as e:
        log.warning("samples of the last cell not written: %s", e)
    described = more.pop("described")
    try:
        write_meta(run_dir, cfg.to_dict(), workloads=described, telemetry=notes, sample_hz=cfg.sample_hz,
                   sampler_ticks=sampler.ticks if sampler else 0, interrupted=more["status"].startswith("interr"),
                   **more)
    except (OSError, UserError) as e:
        log.warning("meta.json not updated: %s", e)


def runnable(cells: list[Planned]) -> int:
    return sum(p.reason is None for p in cells)
