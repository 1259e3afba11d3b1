"""Plan the matrix, group cells by (processes, backend), start torchrun once per group.

Inside a group one process group runs the cells one after another (``bench.worker``). The launcher
follows the workers' event files: measurements become a row at once (:func:`bench.rows.build_row`,
with the telemetry of the cell's window); a cell that raises is ``failed`` with its message; a cell
that outlives ``cell_timeout_s`` is ``timeout``, the group is stopped and relaunched with the cells
it had not run. Progress goes to a callback, so the caller decides how to show it.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import strategies
from bench import UserError, backends, spec
from bench.config import RunConfig, parse_workload
from bench.hardware import cpu_threads
from bench.metrics import Metric, registry
from bench.results import RunWriter, cell_columns, new_run_id, write_meta
from bench.rows import build_row, failure_row, telemetry_means
from bench.spec import CellSpec, GroupPlan, Measure, RankMeasurement
from bench.workloads import Workload, resolve

log = logging.getLogger("parbench")
STARTUP_S = 120.0  # torchrun + import torch + process group, before the first cell starts


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

    @property
    def label(self) -> str:
        return f"{self.backend} x{self.n_procs}"


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


def plan_devices(device: str, n_devices: int) -> tuple[int, ...]:
    """The CUDA indices a cell of ``n_devices`` runs on: the first n visible GPUs (torchrun binds
    local rank r to the r-th); nothing else in the harness derives device ids."""
    return tuple(range(n_devices)) if device == "cuda" else ()


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
                      target_ci=cfg.target_ci, time_cap_s=cfg.time_cap_s)
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
                                    devices=plan_devices(cfg.device, n), options=options, labels={},
                                    role=strat.role, measure=measure, scaling=cfg.scaling)
                    reason = reason or strat.check(cell, gpus=gpus)
                    if reason is None and cfg.device == "cpu" and n > cpu_threads() * 4:
                        reason = f"world size {n} > 4 x {cpu_threads()} CPU threads"
                    if reason is None:
                        cell = dataclasses.replace(cell, labels=strat.label_values(cell))
                    cells.append(Planned(spec=cell, reason=reason))
    metrics = registry(m for _, s in strats for m in s.columns())
    return cells, wls, metrics


def group(cells: list[Planned]) -> list[Group]:
    """Runnable cells grouped by (processes, backend), one-process groups first, the reference
    first in its group."""
    groups: dict[tuple[int, str], Group] = {}
    for p in cells:
        if p.reason is not None:
            continue
        c = p.spec
        groups.setdefault((c.n_procs, c.backend), Group(n_procs=c.n_procs, backend=c.backend)).cells.append(c)
    for g in groups.values():
        g.cells.sort(key=lambda c: (c.role != "reference", c.cell_id))
    first_backend = {c.spec.backend for c in cells if c.spec.role == "reference"}
    return [groups[k] for k in sorted(groups, key=lambda k: (k[0], k[1] not in first_backend, k[1]))]


#: What a budget plan assumes a torchrun group and a cell cost beyond their timed steps (start-up,
#: model build, warm-up, profiled steps), by device; measured on this project's machines.
GROUP_START_S = {"cpu": 4.0, "cuda": 15.0}
CELL_OVERHEAD_S = {"cpu": 1.5, "cuda": 4.0}


def budget_plan(cfg: RunConfig, cells: list[Planned], budget_s: float) -> tuple[list[Planned], str]:
    """Fit the run into ``budget_s``: fewer repeats if needed, then each cell's timed steps capped
    by time (at least 3 steps; more while the interval is wide and time is left). Returns the cells
    with their new measurement settings and the plan in one sentence; UserError if even one repeat
    of three steps per cell cannot fit."""
    runnable = [p for p in cells if p.reason is None]
    if not runnable:
        return cells, "nothing to run"
    n_groups = len({(p.spec.n_procs, p.spec.backend) for p in runnable})
    usable = 0.8 * budget_s - n_groups * GROUP_START_S[cfg.device]
    overhead = CELL_OVERHEAD_S[cfg.device]
    repeats = cfg.repeats
    while True:
        cap = usable / (len(runnable) * repeats) - overhead
        if cap >= 0.5 or repeats == 1:
            break
        repeats -= 1
    if cap < 0.2:
        need = (n_groups * GROUP_START_S[cfg.device] + len(runnable) * (overhead + 0.5)) / 0.85
        raise UserError(f"budget {budget_s:g}s is too small for {len(runnable)} cells in {n_groups} process groups "
                        f"(about {need:.0f}s needed); raise --budget or narrow the matrix")
    out = []
    for p in cells:
        m = dataclasses.replace(p.spec.measure, repeats=repeats, steps=min(p.spec.measure.steps, 3),
                                warmup=min(p.spec.measure.warmup, 2), steps_max=max(p.spec.measure.steps_max, 500),
                                time_cap_s=cap)
        out.append(dataclasses.replace(p, spec=dataclasses.replace(p.spec, measure=m)))
    text = (f"budget {budget_s:g}s: {len(runnable)} cells x {repeats} repeat(s) in {n_groups} process group(s); "
            f"each repeat times at least 3 steps and stops adding steps after {cap:.1f}s "
            f"(or when its interval is within {cfg.target_ci:.0%})"
            + (f"; repeats lowered from {cfg.repeats} to fit" if repeats < cfg.repeats else ""))
    return out, text


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_env(nproc: int) -> dict[str, str]:
    env = dict(os.environ)
    # Workers import exactly what this process imports (the checkout, a user's workload module).
    env["PYTHONPATH"] = os.pathsep.join([p for p in sys.path if p] + [env.get("PYTHONPATH", "")])
    # torchrun sets OMP_NUM_THREADS=1 only for nproc > 1; a lone worker would otherwise oversubscribe.
    env.setdefault("OMP_NUM_THREADS", str(max(1, cpu_threads() // nproc)))
    env.setdefault("NCCL_NVLS_ENABLE", "0")
    env.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    return env


class EventReader:
    """Reads new, complete lines from every rank's event file of one launch, as typed events."""

    def __init__(self, prefix: str, nproc: int):
        self.paths = [Path(f"{prefix}-r{r}.jsonl") for r in range(nproc)]
        self.offsets = [0] * nproc

    def poll(self) -> list[spec.Event]:
        out = []
        for i, p in enumerate(self.paths):
            if not p.exists():
                continue
            with open(p) as f:
                f.seek(self.offsets[i])
                data = f.read()
            complete = data[: data.rfind("\n") + 1]
            self.offsets[i] += len(complete)
            out.extend(spec.load_event(line) for line in complete.splitlines() if line.strip())
        return out


def _kill(proc: subprocess.Popen) -> None:
    for sig, wait in ((signal.SIGTERM, 5), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _log_tail(path: Path, n: int = 1) -> str:
    try:
        lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    errs = [ln for ln in lines if "Error" in ln or "error" in ln]
    return " ".join((errs or lines)[-n:]).strip()[:300]


class Telemetry:
    """The launcher's view of the sampler: new rows since the last cell, appended per cell."""

    def __init__(self, sampler, writer: RunWriter):
        self.sampler, self.writer = sampler, writer
        self.pending: list[dict[str, Any]] = []

    def take(self) -> list[dict[str, Any]]:
        """Samples since the last call (also kept for the cell's telemetry window)."""
        if self.sampler is None:
            return []
        self.pending = self.sampler.drain()
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


def run_group(g: Group, gid: int, cfg: RunConfig, writer: RunWriter, work: Path, telemetry: Telemetry,
              on_progress: ProgressFn, trace_dir: Path | None, deadline_unix: float | None = None) -> None:
    """Run a group's cells (all their repeats, in rounds), relaunching after a timeout or a crash,
    until every cell has a row."""
    pending = {c.cell_id: Pending(spec=c) for c in g.cells}
    attempt = 0

    def finish(p: Pending, status: str | None = None, reason: str = "") -> None:
        c = p.spec
        if status is None:
            cls = type(strategies.get(c.strategy_spec))
            row, steps, comm = build_row(c, p.repeats, wall_s=p.wall_s, strategy_metrics=cls.metrics,
                                         expects=cls.distributes, telemetry=p.telemetry)
        else:
            row, steps, comm = failure_row(c, status=status, reason=reason), [], []
        writer.add(row, steps, comm)
        del pending[c.cell_id]
        on_progress(Progress(kind="done", group=g.label, cell=c, status=row["status"]))

    while pending:
        attempt += 1
        prefix = str(work / f"g{gid}-a{attempt}")
        gplan = GroupPlan(backend=g.backend, device=cfg.device, n_procs=g.n_procs, events_prefix=prefix,
                          pg_timeout_s=cfg.cell_timeout_s, trace_dir=str(trace_dir) if trace_dir else None,
                          cells=tuple(p.spec for p in pending.values()),
                          first_repeat={str(k): len(p.repeats) for k, p in pending.items() if p.repeats},
                          deadline_unix=deadline_unix)
        Path(prefix + ".json").write_text(spec.dump(gplan))
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1",
               f"--nproc-per-node={g.n_procs}", "--master-addr=127.0.0.1", f"--master-port={free_port()}",
               "--max-restarts=0", "-m", "bench.worker", prefix + ".json"]
        logpath = Path(prefix + ".log")
        with open(logpath, "w") as logf:
            proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, env=child_env(g.n_procs),
                                    start_new_session=True)
        reader = EventReader(prefix, g.n_procs)
        current: CellSpec | None = None
        errors: dict[int, str] = {}
        started_any = stopped = False
        deadline = time.monotonic() + STARTUP_S + cfg.cell_timeout_s
        timed_out = False
        try:
            while True:
                exited = proc.poll() is not None
                for ev in reader.poll():
                    if isinstance(ev, spec.Stopped):
                        stopped = True
                        continue
                    p = pending.get(ev.cell_id)
                    if p is None:
                        continue
                    if isinstance(ev, spec.Start):
                        current, started_any = p.spec, True
                        deadline = time.monotonic() + cfg.cell_timeout_s
                        on_progress(Progress(kind="start", group=g.label, cell=p.spec))
                    elif isinstance(ev, spec.Error):
                        errors.setdefault(p.spec.cell_id, f"rank {ev.rank}: {ev.reason}")
                    elif isinstance(ev, spec.Measured):
                        samples = telemetry.take()
                        window = ev.ranks[0].window if ev.ranks and ev.ranks[0].window else None
                        p.telemetry.append(telemetry_means(samples, p.spec, window) if window else {})
                        telemetry.flush()
                        p.repeats.append(ev.ranks)
                        p.wall_s += ev.wall_s
                        current = None
                        deadline = time.monotonic() + cfg.cell_timeout_s
                        failed = any(r.status != "ok" for r in ev.ranks)
                        if failed or len(p.repeats) >= p.spec.measure.repeats:
                            finish(p)
                if exited:
                    break
                if time.monotonic() > deadline:
                    timed_out = True
                    _kill(proc)
                    break
                time.sleep(0.05)
        except BaseException:
            _kill(proc)
            raise
        if stopped or (proc.returncode == 0 and not timed_out):
            # The worker ended its rounds (the time budget) or finished: cells keep the repeats they got.
            for p in list(pending.values()):
                if p.repeats:
                    finish(p)
                else:
                    finish(p, "skipped", "time budget: the run's deadline passed before this cell's turn")
            continue
        if not pending:
            continue
        rc = proc.returncode
        # Who gets the blame: the cell that was running; if none had started, every remaining cell
        # (the group itself could not start) -- never loop forever.
        victims = [current] if current is not None else ([] if started_any else [p.spec for p in pending.values()])
        if not victims:
            victims = [next(iter(pending.values())).spec]
        for v in victims:
            if v.cell_id in errors:
                status, reason = "failed", errors[v.cell_id]
            elif timed_out:
                status = "timeout"
                reason = (f"no result within cell_timeout_s={cfg.cell_timeout_s:g}s; group relaunched"
                          if started_any else f"group did not start within {STARTUP_S + cfg.cell_timeout_s:g}s")
            else:
                status = "failed"
                reason = f"worker exited with code {rc}: {_log_tail(logpath)}"
            telemetry.take()
            telemetry.flush()
            finish(pending[v.cell_id], status, reason)


def run(cfg: RunConfig, gpus: int, *, on_progress: ProgressFn | None = None) -> Path:
    """Run the whole matrix; returns the run folder. Rows land on disk as cells finish."""
    cells, wls, metrics = plan(cfg, gpus)
    from bench.config import parse_duration

    budget_s = parse_duration(cfg.budget) if cfg.budget else None
    plan_text = ""
    if budget_s is not None:
        cells, plan_text = budget_plan(cfg, cells, budget_s)
    run_dir = Path(cfg.out) / new_run_id()
    writer = RunWriter(run_dir, cell_schema=cell_columns(metrics))
    work = run_dir / "work"
    work.mkdir()
    trace_dir = run_dir / "traces" if cfg.trace else None
    if trace_dir:
        trace_dir.mkdir()
    described = {n: w.description for n, w in wls.items()}
    write_meta(run_dir, cfg.to_dict(), workloads=described, plan=plan_text)
    from bench.samplers import start_samplers

    sampler, notes = start_samplers(cfg.sample_hz, gpu=cfg.device == "cuda")
    telemetry = Telemetry(sampler, writer)
    writer.append("cells", [failure_row(p.spec, status="skipped", reason=p.reason)
                            for p in cells if p.reason is not None])
    groups = group(cells)
    report = on_progress or (lambda _p: None)
    report(Progress(kind="plan", group="", n=runnable(cells)))
    if plan_text:
        report(Progress(kind="note", group="", text=plan_text))
    deadline = time.time() + budget_s if budget_s else None
    try:
        for gid, g in enumerate(groups):
            if deadline is not None and time.time() > deadline:
                for c in g.cells:
                    writer.add(failure_row(c, status="skipped", reason="time budget: the run's deadline passed "
                                                                     "before this cell's group"))
                    report(Progress(kind="done", group=g.label, cell=c, status="skipped"))
                continue
            report(Progress(kind="group", group=g.label, n=len(g.cells)))
            run_group(g, gid, cfg, writer, work, telemetry, report, trace_dir, deadline)
    finally:
        if sampler is not None:
            sampler.stop()
            notes.update(sampler.notes())
            telemetry.take()
            telemetry.flush()
        write_meta(run_dir, cfg.to_dict(), workloads=described, telemetry=notes, plan=plan_text,
                   sample_hz=cfg.sample_hz, sampler_ticks=sampler.ticks if sampler else 0)
    return run_dir


def runnable(cells: list[Planned]) -> int:
    return sum(p.reason is None for p in cells)
