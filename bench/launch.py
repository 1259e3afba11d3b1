"""Plan the matrix, group cells by (nnodes, nproc, backend), start torchrun once per group.

Inside a group one process group runs the cells one after another (``bench.worker``). The launcher
follows the workers' event files: a finished cell becomes a row at once; a cell that raises is
``failed`` with its message; a cell that outlives ``cell_timeout_s`` is ``timeout``, the group is
stopped and relaunched with the cells it had not run.
"""

from __future__ import annotations

import json
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
from typing import Any

import strategies
from bench.config import RunConfig, parse_workload
from bench.hardware import cpu_threads
from bench.results import RunWriter, new_run_id, write_meta
from bench.workloads import Workload, resolve
from strategies.base import Cell

log = logging.getLogger("parbench")
STARTUP_S = 120.0  # torchrun + import torch + process group, before the first cell starts


@dataclass(kw_only=True)
class Planned:
    cell_id: int
    workload: str  # display name
    workload_spec: str
    dims: dict[str, int]
    strategy: str
    strategy_spec: str
    backend: str
    device: str
    world_size: int
    nproc: int
    role: str = ""
    reason: str | None = None  # set: skipped

    def as_plan(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "reason"}


@dataclass(kw_only=True)
class Group:
    nnodes: int
    nproc: int
    backend: str
    cells: list[Planned] = field(default_factory=list)

    @property
    def label(self) -> str:
        return f"{self.backend} x{self.nproc}"


def expand_strategies(specs: list[str]) -> list[tuple[str, strategies.Strategy]]:
    """(spec, strategy) for each asked strategy, 'all' expanded, duplicates dropped."""
    flat: list[str] = []
    for s in specs:
        flat.extend(strategies.names() if s == "all" else [s])
    out: dict[str, tuple[str, strategies.Strategy]] = {}
    for spec in flat:
        strat = strategies.get(spec)
        out.setdefault(strat.name, (spec, strat))
    return list(out.values())


def plan(cfg: RunConfig, gpus: int) -> tuple[list[Planned], dict[str, Workload]]:
    """Every cell of the matrix, each either runnable or skipped with its reason. A single-device
    reference cell is added for every workload: parity and scaling efficiency need it."""
    wls: dict[str, Workload] = {}
    parsed = []
    for spec in cfg.workloads:
        name, dims = parse_workload(spec)
        wl = resolve(name, seed=cfg.seed, global_batch=cfg.global_batch, **dims)
        wls[wl.name] = wl
        parsed.append((wl, name, dims))
    strats = expand_strategies(cfg.strategies)
    if not any(s.name == "single" for _, s in strats):
        strats.insert(0, ("single", strategies.get("single")))
    cells: list[Planned] = []
    seen: set[tuple] = set()
    for wl, name, dims in parsed:
        for spec, strat in strats:
            backends = cfg.backends if strat.uses_backend else ["none"]
            for backend in backends:
                for ws in cfg.world_sizes if strat.name != "single" else [1]:
                    key = (wl.name, strat.name, backend, ws)
                    if key in seen:
                        continue
                    seen.add(key)
                    cell = Cell(workload=wl.name, strategy=strat.name, backend=backend, device=cfg.device,
                                world_size=ws, gpus_available=gpus, options=cfg.options)
                    reason = strat.check(cell, wl)
                    if reason is None and cfg.device == "cpu" and ws > cpu_threads() * 4:
                        reason = f"world size {ws} > 4 x {cpu_threads()} CPU threads"
                    cells.append(Planned(cell_id=len(cells), workload=wl.name, workload_spec=name, dims=dims,
                                         strategy=strat.name, strategy_spec=spec, backend=backend,
                                         device=cfg.device, world_size=ws, nproc=strat.procs(ws),
                                         role="reference" if strat.name == "single" else "",
                                         reason=reason))
    return cells, wls


def group(cells: list[Planned], backends: list[str], device: str) -> list[Group]:
    """Runnable cells grouped by (nnodes, nproc, backend), smallest groups first (the reference
    runs first). One-process strategies (backend 'none') join a one-process group."""
    one_proc_backend = "nccl" if device == "cuda" and "nccl" in backends else "gloo"
    groups: dict[tuple[int, int, str], Group] = {}
    for c in cells:
        if c.reason is not None:
            continue
        backend = c.backend if c.backend != "none" else one_proc_backend
        key = (1, c.nproc, backend)
        groups.setdefault(key, Group(nnodes=1, nproc=c.nproc, backend=backend)).cells.append(c)
    for g in groups.values():
        g.cells.sort(key=lambda c: (c.strategy != "single", c.cell_id))
    return [groups[k] for k in sorted(groups, key=lambda k: (k[1], k[2] != one_proc_backend))]


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
    """Reads new lines from every rank's event file of one launch."""

    def __init__(self, prefix: str, nproc: int):
        self.paths = [Path(f"{prefix}-r{r}.jsonl") for r in range(nproc)]
        self.offsets = [0] * nproc

    def poll(self) -> list[dict[str, Any]]:
        out = []
        for i, p in enumerate(self.paths):
            if not p.exists():
                continue
            with open(p) as f:
                f.seek(self.offsets[i])
                data = f.read()
            complete = data[: data.rfind("\n") + 1]
            self.offsets[i] += len(complete)
            out.extend(json.loads(line) for line in complete.splitlines() if line.strip())
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


def telemetry_summary(samples: list[dict[str, Any]], row: dict[str, Any]) -> dict[str, float]:
    """Means of the sampled GPU metrics over a cell's timed window, on the GPUs it used."""
    t0, t1 = row.get("timed_start_unix"), row.get("timed_end_unix")
    if t0 is None or row.get("device") != "cuda":
        return {}
    devices = {f"gpu{i}" for i in range(int(row["world_size"]))}
    sums: dict[str, list[float]] = {}
    for s in samples:
        if t0 <= s["t"] <= t1 and s["device"] in devices:
            sums.setdefault(s["metric"], []).append(s["value"])
    names = {"gpu_util_pct": "gpu_util_mean", "sm_active_pct": "sm_active_mean",
             "tensor_active_pct": "tensor_active_mean", "power_w": "power_mean_w"}
    return {names[m]: sum(v) / len(v) for m, v in sums.items() if m in names and v}


def run_group(g: Group, gid: int, cfg: RunConfig, writer: RunWriter, work: Path,
              on_event: Callable[[str, Planned | None], None], sampler=None) -> None:
    """Run a group's cells, relaunching after a timeout or a crash, until every cell has a row."""
    remaining = list(g.cells)
    attempt = 0
    while remaining:
        attempt += 1
        prefix = str(work / f"g{gid}-a{attempt}")
        plan_doc = {
            "backend": g.backend, "device": cfg.device, "steps": cfg.steps, "warmup": cfg.warmup,
            "seed": cfg.seed, "precision": cfg.effective_precision(), "lr": cfg.lr,
            "global_batch": cfg.global_batch, "options": cfg.options, "events_prefix": prefix,
            "pg_timeout_s": cfg.cell_timeout_s, "cells": [c.as_plan() for c in remaining],
            "profile_steps": cfg.profile_steps, "trace_dir": str(writer.dir / "traces") if cfg.trace else None,
        }
        Path(prefix + ".json").write_text(json.dumps(plan_doc, indent=1))
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={g.nnodes}",
               f"--nproc-per-node={g.nproc}", "--master-addr=127.0.0.1", f"--master-port={free_port()}",
               "--max-restarts=0", "-m", "bench.worker", prefix + ".json"]
        logpath = Path(prefix + ".log")
        with open(logpath, "w") as logf:
            proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, env=child_env(g.nproc),
                                    start_new_session=True)
        reader = EventReader(prefix, g.nproc)
        by_id = {c.cell_id: c for c in remaining}
        current: Planned | None = None
        errors: dict[int, str] = {}
        started_any = False
        deadline = time.monotonic() + STARTUP_S + cfg.cell_timeout_s
        timed_out = False
        try:
            while True:
                exited = proc.poll() is not None
                for ev in reader.poll():
                    c = by_id.get(ev.get("cell_id"))
                    if ev["event"] == "start" and c:
                        current, started_any = c, True
                        deadline = time.monotonic() + cfg.cell_timeout_s
                        on_event("start", c)
                    elif ev["event"] == "error" and c:
                        errors.setdefault(c.cell_id, ev["reason"])
                    elif ev["event"] == "done" and c:
                        row = ev["row"]
                        if sampler is not None:
                            samples = sampler.snapshot()
                            row.update(telemetry_summary(samples, row))
                            writer.set_table("samples", samples)
                        writer.add(row, ev["steps"], ev.get("tables"))
                        remaining.remove(c)
                        current = None
                        deadline = time.monotonic() + cfg.cell_timeout_s
                        on_event("done", c)
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
            writer.add(row_for(v, cfg, status=status, reason=reason))
            remaining.remove(v)
            on_event("done", v)


def row_for(c: Planned, cfg: RunConfig, *, status: str, reason: str) -> dict[str, Any]:
    return dict(cell_id=c.cell_id, workload=c.workload, strategy=c.strategy, backend=c.backend,
                device=c.device, world_size=c.world_size, nproc=c.nproc, role=c.role, status=status,
                reason=reason, steps=cfg.steps, warmup=cfg.warmup, precision=cfg.effective_precision())


def run(cfg: RunConfig, gpus: int, *, progress: bool = True) -> Path:
    """Run the whole matrix; returns the run folder. Rows land on disk as cells finish."""
    cells, wls = plan(cfg, gpus)
    run_dir = Path(cfg.out) / new_run_id()
    writer = RunWriter(run_dir)
    work = run_dir / "work"
    work.mkdir()
    if cfg.trace:
        (run_dir / "traces").mkdir()
    described = {n: w.description for n, w in wls.items()}
    write_meta(run_dir, cfg.to_dict(), workloads=described)
    from bench.samplers import start_samplers

    sampler, notes = start_samplers(cfg.sample_hz, gpu=cfg.device == "cuda")
    for c in cells:
        if c.reason is not None:
            writer.add(row_for(c, cfg, status="skipped", reason=c.reason))
    groups = group(cells, cfg.backends, cfg.device)
    runnable = sum(len(g.cells) for g in groups)
    from bench.progress import MatrixProgress

    try:
        with MatrixProgress(total=runnable, enabled=progress) as bar:
            for gid, g in enumerate(groups):
                bar.group(g.label, len(g.cells))
                run_group(g, gid, cfg, writer, work, bar.event, sampler)
    finally:
        if sampler is not None:
            sampler.stop()
            notes.update(sampler.notes())
            writer.set_table("samples", sampler.snapshot())
            writer.flush()
        write_meta(run_dir, cfg.to_dict(), workloads=described, telemetry=notes,
                   sample_hz=cfg.sample_hz, sampler_ticks=sampler.ticks if sampler else 0)
    return run_dir
