"""A serving run: for each world size and placement, one pool of processes; through it, every
(policy, load level) cell, then the rate sweep and the noisy-neighbour cells; all written to the
run folder as they finish (cells with mode=serve, requests, serve_tenants, samples)."""

from __future__ import annotations

import contextlib
import json
import logging
import math
import signal
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench.core.errors import UserError
from bench.core.metrics import registry
from bench.core.spec import ServeCellSpec, outcome
from bench.results.identity import start_row
from bench.results.session import RUNNING, RunSession, Samplers
from bench.results.store import RunWriter, cell_columns, new_run_id
from bench.runtime import signals
from bench.serve import schema, steady, sweep
from bench.serve.config import Load, ServeConfig
from bench.serve.launcher import CellLoad, Pool, ServeError
from bench.serve.limit import limit
from bench.serve.loadgen import closed_sizes, schedule
from bench.serve.models import ServeModel, resolve_precision, run_grouped
from bench.workloads import Workload, planned

log = logging.getLogger(__name__)
#: most requests a closed-loop cell may send within its duration
CLOSED_MAX = 20_000
#: Seconds a pool's processes may take to start (import torch, build the model), on top of
#: --cell-timeout.
STARTUP_S = 120.0


def _probe_items(sm: ServeModel) -> list[tuple[int, int]]:
    """Fixed probe requests: a full-size one, four of one shape (so a dynamic batch and
    nn.DataParallel's scatter have rows to split), and the smallest."""
    half = max(1, sm.max_size // 2)
    sizes = [sm.max_size, half, half, half, half, 1]
    return [(10_000_000 + i, s) for i, s in enumerate(sizes)]


def reference(cfg: ServeConfig, sm: ServeModel, items: list[tuple[int, int]]) -> list[torch.Tensor]:
    """The answers of one device (cuda:0 or the CPU) to the probe inputs: what every placement must return."""
    dev = torch.device("cuda:0" if cfg.device == "cuda" else "cpu")
    dtype = resolve_precision(cfg.precision, dev)
    model = sm.build(dev, dtype)
    out = run_grouped(sm.runner(model), [sm.make_input(r, s) for r, s in items], dev, dtype)
    del model
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    return out


class _Overdue(BaseException):
    """User code in this process ran past its time (raised by SIGALRM; a BaseException, so a
    user's own ``except Exception`` does not swallow it)."""


@contextlib.contextmanager
def _bounded(seconds: float) -> Iterator[None]:
    """Raise :class:`_Overdue` in this thread after ``seconds``: a user's factory, build or forward
    that never returns must not hold the command. Timed by SIGALRM where this is the main thread
    (elsewhere unbounded)."""
    timed = threading.current_thread() is threading.main_thread() and hasattr(signal, "setitimer")
    if timed:
        def alarm(_signum, _frame):
            raise _Overdue()

        old = signal.signal(signal.SIGALRM, alarm)
        signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        if timed:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)


def _first_line(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"


def load(cfg: ServeConfig) -> tuple[Workload, ServeModel]:
    """The workload and its serving model, in this process: a factory, build or first batch that
    raises or does not return within --workload-timeout is bad input (one line, exit 2), before any
    pool or run folder."""
    wl, _ = planned(cfg.workload, cfg.dims, seed=cfg.seed, global_batch=None, timeout_s=cfg.workload_timeout_s)
    try:
        with _bounded(cfg.workload_timeout_s):
            return wl, ServeModel.create(wl, task=cfg.task, gen_tokens=cfg.gen_tokens, seed=cfg.seed)
    except _Overdue:
        raise UserError(f"workload {cfg.workload}: its first batch did not return within --workload-timeout "
                        f"{cfg.workload_timeout_s:g} s; fix the workload or raise --workload-timeout") from None
    except UserError:
        raise
    except ValueError as e:  # the task does not fit the model
        raise UserError(f"--task/--workload: {e}") from None
    except Exception as e:  # noqa: BLE001 - a user's model or data failing is bad input, said in one line
        raise UserError(f"workload {cfg.workload}: preparing it for serving failed ({_first_line(e)}); "
                        "fix the workload") from None


def _guarded_reference(cfg: ServeConfig, sm: ServeModel, items: list[tuple[int, int]], name: str) -> list:
    """:func:`reference` in this process, before any pool starts: a workload whose forward raises or
    hangs is bad input (one line, exit 2; the hang bounded by --cell-timeout), not a traceback or a
    run stuck until something kills it."""
    try:
        with _bounded(cfg.cell_timeout_s):
            return reference(cfg, sm, items)
    except _Overdue:
        raise UserError(f"workload {name}: one device did not answer the {len(items)} parity probes within "
                        f"--cell-timeout {cfg.cell_timeout_s:g} s; fix the workload's forward, raise "
                        "--cell-timeout or pass --no-parity") from None
    except torch.OutOfMemoryError:
        raise UserError(f"workload {name} does not fit one device for the parity reference; pass --no-parity to "
                        "serve it across devices (e.g. --placements pipeline) without that check") from None
    except (RuntimeError, ValueError, TypeError, IndexError, KeyError, AttributeError, AssertionError) as e:
        raise UserError(f"workload {name}: its forward failed on one device before serving "
                        f"({_first_line(e)}); fix the workload") from None


def parity_err(ref: list[torch.Tensor], answers: dict[int, list]) -> float:
    """Largest relative difference of any process's answers from the reference's (normalised by
    the reference's largest magnitude, so near-zero entries do not blow it up)."""
    worst = 0.0
    for outs in answers.values():
        for a, b in zip(outs, ref):
            if a.shape != b.shape:
                return float("inf")
            err = float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))
            if not math.isfinite(err):  # NaN answers are no parity (max(0.0, nan) kept 0.0: "perfect")
                return float("inf")
            worst = max(worst, err)
    return worst


def requests_for(cfg: ServeConfig, load: Load, sm: ServeModel, seed: int) -> list:
    """The requests of a load level (sizes clipped to what the model takes)."""
    tenants = [t if t.size_max <= sm.max_size else _clip(t, sm.max_size) for t in load.tenants]
    if load.clients:  # as many as the clients send within the duration (or --requests)
        return closed_sizes(tenants, seed=seed, n=cfg.max_requests or CLOSED_MAX)
    if cfg.max_requests:
        return schedule(tenants, seed=seed, n_requests=cfg.max_requests)
    return schedule(tenants, seed=seed, duration_s=cfg.duration_s)


def _clip(t, hi):
    from dataclasses import replace

    return replace(t, size_max=hi, size_min=min(t.size_min, hi))


class ServeRun:
    """State of one run: its writer, model facts, parity reference and cell counter."""

    def __init__(self, cfg: ServeConfig, on_cell: Callable[[dict[str, Any]], None] | None = None):
        cfg.check()
        self.cfg = cfg
        self.wl, self.sm = load(cfg)
        self.precision = "bf16" if resolve_precision(cfg.precision, torch.device(cfg.device)) == torch.bfloat16 \
            else "fp32"
        self.cell_id = 0
        self.warmups: list[dict[str, Any]] = []  # per pool: sizes served before its first cell, seconds
        self.on_cell = on_cell or (lambda row: None)
        self.items = _probe_items(self.sm)
        self.ref = _guarded_reference(cfg, self.sm, self.items, self.wl.name) if cfg.parity else None
        self.rows: list[dict[str, Any]] = []
        self.summary: dict[str, Any] = {}  # the rate sweep's and the noisy neighbour's results, for meta.json
        # the run folder only once the workload and task are known good: bad input leaves no folder
        self.dir = Path(cfg.out) / new_run_id()
        self.writer = RunWriter(self.dir, cell_schema=cell_columns(registry(schema.SERVE_METRICS)),
                                tables=schema.TABLES)
        self.session = RunSession(self.dir, cfg.to_dict(), writer=self.writer, fields=self._meta,
                                  samplers=Samplers(cfg.sample_hz, cfg.device == "cuda"), defer=True)
        self.session.drain = lambda: self.append("samples", self.session.take())

    @property
    def sampler(self):
        """The run's sampler (None before the run began, or with sample_hz 0)."""
        return self.session.sampler

    def _meta(self, status: str) -> dict[str, Any]:
        """meta.json's serving fields: the samplers' notes; once the run ended, the sweep's results and
        each pool's warm-up."""
        more = {} if status == RUNNING else {"serve_sweep": self.summary, "serve_warmup": self.warmups}
        return {"mode": "serve", "sampler_notes": self.session.notes, **more}

    def append(self, table: str, rows: list[dict[str, Any]]) -> None:
        """Rows to one of the run's tables; a full disk or a folder gone read-only stops the run with
        one line (the parts already written stay whole)."""
        try:
            self.writer.append(table, rows)
        except UserError as e:
            why = getattr(e.__context__, "strerror", None) or str(e)
            raise UserError(f"cannot write the {table} table in {self.dir} ({why}); the cells that finished are "
                            "kept there: free space and run parbench serve again") from None

    def note_error(self, e: ServeError, where: str) -> None:
        """A serving process's traceback, kept in the run folder's errors.log (the row says one line)."""
        if not e.detail:
            return
        try:
            with open(self.dir / "errors.log", "a") as f:
                f.write(f"--- {where}: {e}\n{e.detail}\n")
        except OSError as err:
            log.info("errors.log not written: %s", err)

    def devices(self, world: int) -> list[str]:
        return [f"cuda:{i}" for i in range(world)] if self.cfg.device == "cuda" else [f"cpu:{i}" for i in range(world)]

    def plan(self, placement: str, world: int, policy: str, load: Load) -> ServeCellSpec:
        """The spec of the next serving cell (``self.cell_id``)."""
        batch = policy == "batch"
        return ServeCellSpec(
            cell_id=self.cell_id, workload=self.wl.name, strategy=placement, policy=policy, load=load.label,
            scenario=load.scenario, task=self.sm.task, offered_rps=load.rate or None,
            batch_max=self.cfg.batch_max if batch else 1, batch_wait_s=self.cfg.batch_wait_ms / 1e3 if batch else 0.0,
            slo_s=self.cfg.slo_ms / 1e3 if self.cfg.slo_ms else None, device=self.cfg.device, world_size=world,
            precision=self.precision, params=self.wl.params)

    def base_row(self, spec: ServeCellSpec, status: str = "ok", reason: str | None = None) -> dict[str, Any]:
        """The planned facts of a serving cell, through the row start every mode shares (status ok
        until the cell says otherwise)."""
        gpu = torch.cuda.get_device_name(0) if spec.device == "cuda" else None
        return start_row(
            spec, status=status, reason=reason, role=spec.role, precision=spec.precision, params=spec.params,
            gpu_name=gpu, serve_policy=spec.policy, serve_load=spec.load, serve_scenario=spec.scenario,
            serve_task=spec.task, serve_offered_rps=spec.offered_rps, serve_batch_max=spec.batch_max,
            serve_batch_wait_s=spec.batch_wait_s, global_batch=spec.batch_max, slo_s=spec.slo_s,
            serve_graphs=self.cfg.graphs_for(spec.strategy, spec.task))

    def cell(self, pool: Pool | None, placement: str, world: int, policy: str, load: Load,
             parity: float | None, failure: str | None = None, skip: str | None = None) -> dict[str, Any]:
        """Run one cell through ``pool`` (or record why it is ``skip``-ped or its ``failure``) and
        append its rows. A stop signal noted earlier is raised here, before the cell starts."""
        signals.check_stop()
        self.cell_id += 1
        spec = self.plan(placement, world, policy, load)
        row = self.base_row(spec, "skipped", skip) if skip is not None else self.base_row(spec)
        row["parity_rel_err"] = parity
        if skip is None and failure is None and pool is not None:
            reqs = requests_for(self.cfg, load, self.sm, self.cfg.seed)
            row["serve_requests"] = len(reqs)
            row["nproc"] = len(pool.specs)
            try:
                how = CellLoad(clients=load.clients, batch_max=self.cfg.batch_max,
                               batch_wait_s=self.cfg.batch_wait_ms / 1e3, slow_s=dict(self.cfg.slow or {}),
                               seed=self.cfg.seed + self.cell_id, tenants=tuple(t.name for t in load.tenants),
                               timeout_s=self.cfg.cell_timeout_s,
                               closed_s=0.0 if self.cfg.max_requests else self.cfg.duration_s)
                res = pool.run_cell(policy=policy, requests=reqs, load=how)
            except ServeError as e:
                signals.check_stop()  # processes that a stop signal ended: the stop is the news, not a failed cell
                failure = str(e)
                self.note_error(e, f"cell {self.cell_id}")
            else:
                self._finish(row, res, pool, load)
        if failure is not None:
            row.update(outcome("failed", failure.strip().splitlines()[-1][:300]))
        self.append("cells", [row])
        self.rows.append(row)
        self.on_cell(row)
        return row

    def _finish(self, row: dict[str, Any], res, pool: Pool, load: Load) -> None:
        devs = {s.wid: ",".join(s.devices) for s in pool.specs}
        if pool.placement == "pipeline":
            devs = {i: "pipeline:" + ",".join(d for s in pool.specs for d in s.devices) for i in devs}
        reqs = schema.request_rows(self.cell_id, res.records, devs, self.sm.tokens)
        row["serve_requests"] = len(res.records)  # sent (a closed loop sends what its duration holds)
        self.append("requests", reqs)
        self.append("serve_tenants", schema.tenant_rows(self.cell_id, reqs))
        row.update(schema.cell_metrics(reqs, res.workers, res.wall_s, self.sm.samples))
        row.update(cell_wall_s=res.wall_s, timed_start_unix=res.t0_unix, timed_end_unix=res.t0_unix + res.wall_s,
                   dispatch_lag_max_s=res.lag_max_s)
        span = max(r["end_s"] for r in reqs) - min(r["arrival_s"] for r in reqs) if reqs else 0
        if span > 0 and self.sm.is_gpt:
            row["serve_tokens_s"] = sum(r["tokens"] for r in reqs) / span
        if row.get("energy_j") is not None and row.get("throughput_samples_s"):
            row["energy_per_sample_j"] = row["energy_j"] / sum(self.sm.samples(r["size"]) for r in reqs)
        if not load.clients:  # open loop: a closed loop's queue is bounded by its clients
            flags = steady.steady_flags([r["arrival_s"] for r in reqs], [r["latency_s"] for r in reqs],
                                       row.get("little_rel_err"))
            row["stable"], row["noise"] = not flags, "; ".join(flags) or None
        if self.cfg.slo_ms:
            row["slo_met"] = steady.meets_target(row, [r["arrival_s"] for r in reqs], self.cfg.slo_ms / 1e3,
                                                open_loop=not load.clients)
        self._telemetry(row, res, pool)
        row.update(limit(reqs, res.wall_s, achieved_rps=row.get("serve_achieved_rps"), batch_max=res.batch_max,
                         gpu_util_pct=row.get("gpu_util_mean"), slowed=bool(self.cfg.slow),
                         pipeline=pool.placement == "pipeline", graphs=bool(row.get("serve_graphs"))))

    def _telemetry(self, row: dict[str, Any], res, pool: Pool) -> None:
        """The sampler's rows to the samples table; GPU utilisation and power of the cell's GPUs."""
        if self.sampler is None:
            return
        rows = self.sampler.drain()
        self.append("samples", rows)
        gpus = {f"gpu{torch.device(d).index}" for s in pool.specs for d in s.devices if d.startswith("cuda")}
        lo, hi = res.t0_unix, res.t0_unix + res.wall_s
        for metric, col in (("gpu_util_pct", "gpu_util_mean"), ("power_w", "power_mean_w")):
            v = [r["value"] for r in rows if r["device"] in gpus and r["metric"] == metric and lo <= r["t"] <= hi]
            if v:
                row[col] = float(np.mean(v))


def run(cfg: ServeConfig, on_cell: Callable[[dict[str, Any]], None] | None = None,
        on_pool: Callable[[str, int], None] | None = None) -> Path:
    """Run every cell of ``cfg``; returns the run folder. ``on_pool(placement, world)`` is called
    as each pool starts. A stop signal (see :mod:`bench.runtime.signals`) is raised only between
    cells or while one is served, never between a finished cell's rows; the cells that finished keep
    their rows, and meta.json says the run was interrupted."""
    sr = ServeRun(cfg, on_cell)
    with sr.session:
        sr.session.begin()
        for world in cfg.world_sizes:
            for placement in cfg.placements:
                policies = cfg.policies if placement == "replicas" else \
                    ["pinned" if placement == "pinned-tenants" else "-"]
                (on_pool or (lambda _p, _w: None))(placement, world)
                _placement(sr, placement, world, policies, sr.summary)
        signals.check_stop()  # a stop noted while the last cell was written
    return sr.dir


#: most distinct request sizes a pool serves in its warm-up (evenly spread when there are more)
WARM_SIZES = 128


def warm_sizes(sr: ServeRun, loads: list) -> list[int]:
    """The distinct request sizes the pool's cells will send (at most WARM_SIZES, spread evenly)."""
    sizes = sorted({r.size for load in loads for r in requests_for(sr.cfg, load, sr.sm, sr.cfg.seed)})
    if len(sizes) > WARM_SIZES:
        sizes = [sizes[round(i * (len(sizes) - 1) / (WARM_SIZES - 1))] for i in range(WARM_SIZES)]
    return sizes


def warm_up(pool: Pool, sr: ServeRun, loads: list) -> None:
    """Serve every size the cells will send (alone and as a batch) through every entry process
    before the first cell. Measured on 4x H100 (gpt-small, sizes 16-96): without it the first cell of each
    pool paid every shape's first call (p50 2.3-3.8 s at 300 req/s, while the next cell at 1200
    req/s had p50 92 ms), and the placement measured first looked worst."""
    sizes = warm_sizes(sr, loads)
    # Each size alone and as a batch: of batch_max (dynamic batching), and of at least one row per
    # device of a process (nn.DataParallel scatters rows; one row would warm only its first GPU).
    batch = max(sr.cfg.batch_max, max(len(s.devices) for s in pool.specs))
    t = time.perf_counter()
    pool.probe([(20_000_000 + i, s) for i, s in enumerate(sizes)], timeout=sr.cfg.cell_timeout_s, warm=True,
               batch=batch)
    seconds = time.perf_counter() - t
    sr.warmups.append({"placement": pool.placement, "world_size": pool.world, "sizes": len(sizes),
                       "batch": batch, "seconds": round(seconds, 3)})
    log.info("%s x%d warmed up on %d request sizes in %.1f s", pool.placement, pool.world, len(sizes), seconds)


def _placement(sr: ServeRun, placement: str, world: int, policies: list[str], summary: dict[str, Any]) -> None:
    cfg = sr.cfg
    base = {"workload": cfg.workload, "dims": cfg.dims, "seed": cfg.seed, "task": sr.sm.task,
            "gen_tokens": cfg.gen_tokens, "precision": cfg.precision,
            "graphs": cfg.graphs_for(placement, sr.sm.task)}
    loads = cfg.levels() + (cfg.noisy_loads() if cfg.noisy else [])
    why = skip = None
    if cfg.device == "cuda" and world > torch.cuda.device_count():
        skip = f"needs {world} GPUs, {torch.cuda.device_count()} visible"
    pool, parity = None, None
    try:
        if skip is None:
            pool, parity, why = _start(sr, placement, world, base, loads)
        for policy in policies:
            for load in loads:
                row = sr.cell(pool, placement, world, policy, load, parity, failure=why, skip=skip)
                if row["status"] == "failed" and pool is not None:
                    # its processes may hold a half-served cell: later cells of this pool are not run
                    pool.close(grace_s=STOP_GRACE_S)
                    pool, why = None, f"not run: an earlier cell of this pool failed ({row['reason']})"
            if cfg.slo_ms and why is None and skip is None:
                key = f"{placement}/{policy}/ws{world}"
                summary[key] = sweep.run_sweep(lambda load: sr.cell(pool, placement, world, policy, load, parity),
                                               cfg, sr.sm)
    finally:
        if pool is not None:  # stopped by a signal or an error: its processes may be mid-cell, no wait for them
            pool.close(grace_s=5.0 if sys.exc_info()[0] is None else STOP_GRACE_S)


#: Seconds a serving process of a stopped run or a failed pool gets to exit before it is killed (it
#: may be mid-cell, or stuck in the forward that failed).
STOP_GRACE_S = 0.5


def _start(sr: ServeRun, placement: str, world: int, base: dict[str, Any], loads: list) -> \
        tuple[Pool | None, float | None, str | None]:
    """Start a placement's pool, probe its parity and warm it up: (pool, parity, None), or (None,
    None, why) when that failed (the failure is kept in errors.log)."""
    t = time.perf_counter()
    pool = parity = None
    try:
        pool = Pool(placement, world, sr.devices(world), base, start_timeout_s=STARTUP_S + sr.cfg.cell_timeout_s,
                    stop=signals.check_stop)
        log.info("%s x%d started in %.1f s", placement, world, time.perf_counter() - t)
        if sr.ref is not None:
            parity = parity_err(sr.ref, pool.probe(sr.items, timeout=sr.cfg.cell_timeout_s))
        warm_up(pool, sr, loads)
    except ServeError as e:
        signals.check_stop()  # processes that a stop signal ended: the stop is the news
        sr.note_error(e, f"{placement} ws{world}, before its first cell")
        if pool is not None:
            pool.close(grace_s=STOP_GRACE_S)
        return None, None, str(e)
    except BaseException:
        if pool is not None:
            pool.close(grace_s=STOP_GRACE_S)
        raise
    return pool, parity, None


def summary_lines(rows: list[dict[str, Any]]) -> list[str]:
    """Each cell for the terminal, within 100 columns: what it was and what it reached, then an
    indented line with the request count, parity and any noise flag, and one with what limits it (a
    failed cell: its reason)."""
    out = []
    for r in rows:
        head = f"{r['strategy']:<15} ws{r['world_size']} {r['serve_policy']:<8} {r['serve_load']:<16}"
        if r["status"] != "ok":
            out.append(f"{head} {r['status']}\n    {r.get('reason')}")
            continue

        def ms(k):
            v = r.get(k)
            return "    -  " if v is None or v != v else f"{v * 1e3:7.2f}"

        parity = "-" if r.get("parity_rel_err") is None else format(r["parity_rel_err"], ".1e")
        shown = [p for p in str(r.get("latency_refused") or "").split(", ") if p.startswith(("p50 ", "p99 "))]
        out.append(f"{head} {r.get('serve_achieved_rps') or 0:8.1f} req/s  p50 {ms('latency_p50_s')} ms  "
                   f"p99 {ms('latency_p99_s')} ms\n    n={r.get('latency_n')}  parity {parity}"
                   + (f"  too few requests for {', '.join(shown)}" if shown else "")
                   + (f"  (!) {r['noise']}" if r.get("noise") else "")
                   + ("\n" + textwrap.fill(f"limited by {r['serve_limit']}", 100, initial_indent="    ",
                                            subsequent_indent="      ") if r.get("serve_limit") else ""))
    return out


def dumps(summary: dict[str, Any]) -> str:
    return json.dumps(summary, indent=2, default=str)
