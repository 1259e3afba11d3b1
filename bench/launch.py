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
from bench.rows import build_row, failure_row
from bench.spec import CellSpec, GroupPlan, Measure
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

    kind: Literal["plan", "group", "start", "done"]
    group: str
    cell: CellSpec | None = None
    n: int = 0
    status: str = ""


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
                      precision=cfg.effective_precision(), seed=cfg.seed, lr=cfg.lr)
    one_proc_backend = backends.for_one_process(cfg.device, cfg.backends)
    cells: list[Planned] = []
    seen: set[tuple] = set()
    for wl, name, dims in parsed:
        facts = wl.facts(name, dims)
        for sp, strat in strats:
            for backend in cfg.backends if not strat.one_process else [one_proc_backend]:
                for n in cfg.world_sizes if strat.name != "single" else [1]:
                    key = (wl.name, strat.name, backend, n)
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
                                    role=strat.role, measure=measure)
                    reason = reason or strat.check(cell, gpus=gpus)
                    if reason is None and cfg.device == "cpu" and n > cpu_threads() * 4:
                        reason = f"world size {n} > 4 x {cpu_threads()} CPU threads"
                    if reason is None:
                        cell = dataclasses.replace(cell, labels=strat.label_values(cell))
                    cells.append(Planned(spec=cell, reason=reason))
    metrics = registry(m for _, s in strats for m in (*s.labels, *s.metrics))
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


def run_group(g: Group, gid: int, cfg: RunConfig, writer: RunWriter, work: Path, telemetry: Telemetry,
              metrics: dict[str, list[Metric]], on_progress: ProgressFn, trace_dir: Path | None) -> None:
    """Run a group's cells, relaunching after a timeout or a crash, until every cell has a row."""
    remaining = list(g.cells)
    attempt = 0
    while remaining:
        attempt += 1
        prefix = str(work / f"g{gid}-a{attempt}")
        gplan = GroupPlan(backend=g.backend, device=cfg.device, n_procs=g.n_procs, events_prefix=prefix,
                          pg_timeout_s=cfg.cell_timeout_s, trace_dir=str(trace_dir) if trace_dir else None,
                          cells=tuple(remaining))
        Path(prefix + ".json").write_text(spec.dump(gplan))
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1",
               f"--nproc-per-node={g.n_procs}", "--master-addr=127.0.0.1", f"--master-port={free_port()}",
               "--max-restarts=0", "-m", "bench.worker", prefix + ".json"]
        logpath = Path(prefix + ".log")
        with open(logpath, "w") as logf:
            proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, env=child_env(g.n_procs),
                                    start_new_session=True)
        reader = EventReader(prefix, g.n_procs)
        by_id = {c.cell_id: c for c in remaining}
        current: CellSpec | None = None
        errors: dict[int, str] = {}
        started_any = False
        deadline = time.monotonic() + STARTUP_S + cfg.cell_timeout_s
        timed_out = False
        try:
            while True:
                exited = proc.poll() is not None
                for ev in reader.poll():
                    c = by_id.get(ev.cell_id)
                    if c is None:
                        continue
                    if isinstance(ev, spec.Start):
                        current, started_any = c, True
                        deadline = time.monotonic() + cfg.cell_timeout_s
                        on_progress(Progress(kind="start", group=g.label, cell=c))
                    elif isinstance(ev, spec.Error):
                        errors.setdefault(c.cell_id, f"rank {ev.rank}: {ev.reason}")
                    elif isinstance(ev, spec.Measured):
                        samples = telemetry.take()
                        row, steps, comm = build_row(c, ev.ranks, wall_s=ev.wall_s,
                                                     strategy_metrics=metrics[c.strategy], samples=samples)
                        writer.add(row, steps, comm)
                        telemetry.flush()
                        remaining.remove(c)
                        current = None
                        deadline = time.monotonic() + cfg.cell_timeout_s
                        on_progress(Progress(kind="done", group=g.label, cell=c, status=row["status"]))
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
        if not remaining:
            continue
        rc = proc.returncode
        # Who gets the blame: the cell that was running; if none had started, every remaining cell
        # (the group itself could not start) -- never loop forever.
        victims = [current] if current is not None else ([] if started_any else list(remaining))
        if not victims:
            victims = [remaining[0]]
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
            writer.add(failure_row(v, status=status, reason=reason))
            telemetry.flush()
            remaining.remove(v)
            on_progress(Progress(kind="done", group=g.label, cell=v, status=status))


def run(cfg: RunConfig, gpus: int, *, on_progress: ProgressFn | None = None) -> Path:
    """Run the whole matrix; returns the run folder. Rows land on disk as cells finish."""
    cells, wls, metrics = plan(cfg, gpus)
    run_dir = Path(cfg.out) / new_run_id()
    writer = RunWriter(run_dir, cell_schema=cell_columns(metrics))
    work = run_dir / "work"
    work.mkdir()
    trace_dir = run_dir / "traces" if cfg.trace else None
    if trace_dir:
        trace_dir.mkdir()
    described = {n: w.description for n, w in wls.items()}
    write_meta(run_dir, cfg.to_dict(), workloads=described)
    from bench.samplers import start_samplers

    sampler, notes = start_samplers(cfg.sample_hz, gpu=cfg.device == "cuda")
    telemetry = Telemetry(sampler, writer)
    writer.append("cells", [failure_row(p.spec, status="skipped", reason=p.reason)
                            for p in cells if p.reason is not None])
    by_strategy: dict[str, list[Metric]] = {}
    for p in cells:
        if p.spec.strategy not in by_strategy:
            cls = type(strategies.get(p.spec.strategy_spec))
            by_strategy[p.spec.strategy] = [*cls.labels, *cls.metrics]
    groups = group(cells)
    report = on_progress or (lambda _p: None)
    report(Progress(kind="plan", group="", n=runnable(cells)))
    try:
        for gid, g in enumerate(groups):
            report(Progress(kind="group", group=g.label, n=len(g.cells)))
            run_group(g, gid, cfg, writer, work, telemetry, by_strategy, report, trace_dir)
    finally:
        if sampler is not None:
            sampler.stop()
            notes.update(sampler.notes())
            telemetry.take()
            telemetry.flush()
        write_meta(run_dir, cfg.to_dict(), workloads=described, telemetry=notes,
                   sample_hz=cfg.sample_hz, sampler_ticks=sampler.ticks if sampler else 0)
    return run_dir


def runnable(cells: list[Planned]) -> int:
    return sum(p.reason is None for p in cells)
