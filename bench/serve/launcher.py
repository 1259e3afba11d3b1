"""The launcher: starts a placement's processes once, then drives cells of load through them.

A :class:`Pool` is one placement on ``world`` devices: its processes stay up across the cells that
share it (every policy and load level), so a cell costs its load, not a model build. For each cell
the launcher sends ``begin`` to every process, dispatches requests at their arrival times (open
loop: a late launcher still counts latency from the scheduled arrival, so it cannot hide queueing)
or as clients get answers (closed loop), collects the answers on a receiver thread (which keeps the
outstanding counts join-shortest-queue reads) and ends the cell with sentinels. The processes are
started, watched and stopped through :class:`bench.runtime.spawned.Spawned`.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bench.runtime.crash import exit_text
from bench.runtime.spawned import Spawned
from bench.serve.loadgen import Request
from bench.serve.policies import SHARED, Pinned, Router, make_router
from bench.serve.worker import WorkerSpec, main

PLACEMENTS = ("replicas", "dataparallel-infer", "pinned-tenants", "pipeline")


class ServeError(RuntimeError):
    """A process failed or a cell did not finish in time; the message says which in one line,
    ``detail`` holds the process's traceback when it sent one."""

    def __init__(self, message: str, detail: str = ""):
        super().__init__(message)
        self.detail = detail


#: How often a wait on the processes looks at them (and at a stop signal) while nothing arrives.
POLL_S = 0.2


@dataclass(frozen=True, kw_only=True)
class CellLoad:
    """How a cell is served besides its requests and policy: ``clients`` > 0 for a closed loop (no
    new request after ``closed_s`` seconds when that is > 0), the batch policy's limits, the slowed
    processes (``slow_s``: process -> seconds added per batch), the router's seed, the tenants a
    pinned placement pins, and how long the cell may take."""

    clients: int = 0
    batch_max: int = 1
    batch_wait_s: float = 0.0
    slow_s: dict[int, float] = field(default_factory=dict)
    seed: int = 0
    tenants: tuple[str, ...] = ()
    timeout_s: float = 600.0
    closed_s: float = 0.0


@dataclass
class CellResult:
    """What one cell produced: per-request records and per-process stats."""

    records: list[dict[str, Any]]
    workers: dict[int, dict[str, Any]]
    t0: float  # perf_counter of the cell's time zero
    t0_unix: float
    wall_s: float
    lag_max_s: float = 0.0  # how late the launcher dispatched its latest request
    batch_max: int = 1  # most requests the processes put in one batch (1 unless the policy batches)
    notes: list[str] = field(default_factory=list)


def specs(placement: str, world: int, devices: list[str], base: dict[str, Any]) -> list[WorkerSpec]:
    """The processes of ``placement`` on ``world`` devices."""
    if placement in ("replicas", "pinned-tenants"):
        return [WorkerSpec(wid=i, role="replica", devices=[devices[i]], **base) for i in range(world)]
    if placement == "dataparallel-infer":
        return [WorkerSpec(wid=0, role="dp", devices=devices[:world], **base)]
    if placement == "pipeline":
        return [WorkerSpec(wid=i, role="stage", devices=[devices[i]], stage=i, n_stages=world, **base)
                for i in range(world)]
    raise ValueError(f"placement {placement!r} unknown; use one of {', '.join(PLACEMENTS)}")


class Pool:
    """The processes of one placement, started once (:class:`Spawned`: CUDA cannot fork)."""

    def __init__(self, placement: str, world: int, devices: list[str], base: dict[str, Any], *,
                 start_timeout_s: float = 300.0, stop: Callable[[], None] | None = None):
        """``stop`` is called from this thread whenever it waits on the processes: it raises to stop
        the pool (:func:`bench.runtime.signals.check_stop`)."""
        self.placement, self.world = placement, world
        self.stop = stop or (lambda: None)
        self.group = Spawned()
        self.specs = specs(placement, world, devices, base)
        self.result_q = self.group.queue()
        self.own = [self.group.queue() for _ in self.specs]
        self.shared_q = self.group.queue() if placement == "replicas" else None
        ready = 0
        try:
            self._spawn()
            while ready < len(self.specs):
                msg = self._get(start_timeout_s, "start")
                if msg[0] == "ready":
                    ready += 1
        except BaseException:  # a process that failed to build, or a stop: end the others we started
            self.close(grace_s=1.0)
            raise

    def _spawn(self) -> None:
        """Start the processes with SIGINT blocked (a blocked signal stays blocked across exec): a
        terminal's Ctrl-C reaches the whole process group, and this process, not each serving
        process, stops the pool and keeps what finished. Blocked here only while they start, so a
        Ctrl-C meanwhile waits and is then this process's, not lost."""
        old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            for i, s in enumerate(self.specs):
                # a pipeline stage hands its output to the next stage's queue; the last stage's "next" is
                # stage 0's (generation goes round the stages once per token)
                nxt = self.own[(i + 1) % len(self.specs)] if self.placement == "pipeline" else None
                self.group.start(main, (s, self.own[i], self.shared_q, nxt, self.result_q), f"parbench-serve-{i}")
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)

    @property
    def entries(self) -> int:
        """Processes requests are routed to (replicas: all; one front otherwise)."""
        return len(self.specs) if self.placement in ("replicas", "pinned-tenants") else 1

    def _get(self, timeout: float, what: str, *, stoppable: bool = True) -> tuple:
        """The next message from the processes; ServeError when one failed or exited, or nothing came
        within ``timeout``. ``stoppable``: the caller's thread may be stopped (:attr:`stop`) while waiting."""
        deadline = time.monotonic() + timeout
        while True:
            if stoppable:
                self.stop()
            try:
                msg = self.result_q.get(timeout=min(POLL_S, max(0.01, deadline - time.monotonic())))
            except Exception:  # noqa: BLE001 - queue.Empty: check the processes are alive, then wait on
                dead = [f"{p.name} exited with {exit_text(p.exitcode)}" for p in self.group.procs if not p.is_alive()]
                if dead:
                    raise ServeError(f"{', '.join(dead)} during {what}") from None
                if time.monotonic() > deadline:
                    raise ServeError(f"no answer within {timeout:.0f} s during {what}") from None
                continue
            if msg[0] == "error":
                raise ServeError(f"serving process {msg[1]} failed during {what}: {msg[3]}", detail=msg[2])
            return msg

    def probe(self, items: list[tuple[int, int]], timeout: float = 300.0, warm: bool = False,
              batch: int = 1) -> dict[int, list]:
        """Every entry process's (or the pipeline's) answers to fixed inputs; ``warm``: the inputs
        are only served (a warm-up), nothing but their completion comes back."""
        targets = range(self.entries)
        for i in targets:
            self.own[i].put(("probe", items, "warm", batch) if warm else ("probe", items))
        out: dict[int, list] = {}
        while len(out) < len(targets):
            msg = self._get(timeout, "the warm-up" if warm else "the parity probe")
            if msg[0] == "probe":
                out[msg[1]] = msg[2]
        return out

    def close(self, grace_s: float = 5.0) -> None:
        """Ask every process to quit, then stop the group (:meth:`Spawned.stop`: a process still
        running after ``grace_s`` is terminated)."""
        for q in self.own:
            try:
                q.put(("quit",))
            except (OSError, ValueError):
                pass
        self.group.stop(grace_s=grace_s)

    # --- one cell --------------------------------------------------------------------------
    def run_cell(self, *, policy: str, requests: list[Request], load: CellLoad | None = None) -> CellResult:
        """Serve ``requests`` (open loop at their arrivals; closed loop with ``load.clients`` when > 0,
        the clients sending no new request after ``load.closed_s`` seconds when that is > 0)."""
        load = load or CellLoad()
        n, timeout_s = self.entries, load.timeout_s
        router: Router = Pinned(n, load.seed, load.tenants) if self.placement == "pinned-tenants" else \
            make_router(policy if self.placement == "replicas" else "round-robin", n, load.seed)
        batching = router.batching  # only the batch policy batches: the others serve one request at a time
        source = "shared" if (router.pick("", [0] * n) == SHARED and self.shared_q is not None) else "own"
        cfg = {"source": source, "batch_max": load.batch_max if batching else 1, "batch_wait_s": load.batch_wait_s,
               "slow_s": dict(load.slow_s)}
        for q in self.own:
            q.put(("begin", cfg))
        cell = _Cell(self, router, requests, clients=load.clients, closed_s=load.closed_s, timeout_s=timeout_s)
        rx = threading.Thread(target=cell.receive, name="parbench-serve-rx", daemon=True)
        rx.start()
        cell.dispatch()
        deadline = time.monotonic() + timeout_s
        while not cell.done.wait(min(POLL_S, max(0.0, deadline - time.monotonic()))):
            self.stop()
            if time.monotonic() >= deadline:
                cell.failure.append(f"the cell did not finish within {timeout_s:g} s")
                break
        wall = time.perf_counter() - cell.t0
        workers = {} if cell.failure else self._end_cell(source == "shared", timeout_s)
        if cell.failure:
            raise ServeError("; ".join(cell.failure))
        return CellResult(records=sorted(cell.rec.values(), key=lambda r: r["rid"]), workers=workers, t0=cell.t0,
                          t0_unix=cell.t0_unix, wall_s=wall, lag_max_s=cell.lag, batch_max=cfg["batch_max"])

    def _end_cell(self, shared: bool, timeout_s: float) -> dict[int, dict[str, Any]]:
        """End the cell with one sentinel per entry process (a pipeline's stages pass theirs on);
        every process's stats of the cell."""
        for i in range(self.entries):
            (self.shared_q if shared else self.own[i]).put(("end",))
        workers: dict[int, dict[str, Any]] = {}
        while len(workers) < len(self.specs):
            msg = self._get(timeout_s, "the end of a cell")
            if msg[0] == "ended":
                workers[msg[1]] = msg[2]
        return workers


class _Cell:
    """One cell's dispatch: the requests sent and answered, the outstanding count per entry
    process (what join-shortest-queue reads), and, in closed loop, the clients' next requests. The
    launcher thread sends (:meth:`dispatch`); the receiver thread (:meth:`receive`) records the
    answers and, in closed loop, sends each client's next request."""

    def __init__(self, pool: Pool, router: Router, requests: list[Request], *, clients: int, closed_s: float,
                 timeout_s: float):
        self.pool, self.router, self.requests = pool, router, list(requests)
        self.clients, self.closed_s, self.timeout_s = clients, closed_s, timeout_s
        self.lock = threading.Lock()
        self.outstanding = [0] * pool.entries
        self.rec: dict[int, dict[str, Any]] = {}
        self.done = threading.Event()
        self.failure: list[str] = []
        self.t0 = time.perf_counter() + 0.05
        self.t0_unix = time.time() + 0.05
        self.lag = 0.0  # how late the latest request went out
        self.sent = self.got = 0
        self.stopped = threading.Event()  # closed loop: no request will be sent any more
        self.closed = iter(self.requests) if clients > 0 else None

    def send(self, r: Request, arrival: float) -> None:
        """Route ``r`` and put it on its process's queue (or the shared one)."""
        with self.lock:
            k = self.router.pick(r.tenant, self.outstanding)
            now = time.perf_counter() - self.t0
            self.lag = max(self.lag, now - arrival)
            self.rec[r.rid] = {"rid": r.rid, "tenant": r.tenant, "size": r.size, "arrival": arrival,
                               "dispatch": now, "worker": k}
            if k != SHARED:
                self.outstanding[k] += 1
            self.sent += 1
        (self.pool.shared_q if k == SHARED else self.pool.own[k]).put(("req", r.rid, r.tenant, r.size))

    def next_closed(self) -> Request | None:
        """A closed-loop client's next request; None once the requests or ``closed_s`` ran out."""
        r = next(self.closed, None)  # type: ignore[arg-type]
        if r is None or (self.closed_s > 0 and time.perf_counter() - self.t0 > self.closed_s):
            self.stopped.set()
            return None
        return r

    def more(self) -> bool:
        """Whether answers are still due."""
        if self.closed is None:
            return self.got < len(self.requests)
        return not (self.stopped.is_set() and self.got >= self.sent)

    def receive(self) -> None:
        """The receiver thread: record answers until none is due; a failure is kept for the
        launcher thread, which raises it."""
        try:
            while self.more():
                msg = self.pool._get(self.timeout_s, "a cell", stoppable=False)
                if msg[0] != "done":
                    continue
                for r in self._record(msg):  # a closed-loop client sends its next request as soon as it has its answer
                    if r is not None:
                        self.send(r, time.perf_counter() - self.t0)
        except Exception as e:  # noqa: BLE001 - reported by the launcher thread
            self.failure.append(str(e))
        finally:
            self.done.set()

    def _record(self, msg: tuple) -> list[Request | None]:
        """Record one "done" message's answers; the closed-loop clients' next requests."""
        nxt = []
        with self.lock:
            for rid, start, end, nb in msg[2]:
                r = self.rec[rid]
                if r["worker"] == SHARED:
                    r["worker"] = msg[1]
                else:
                    self.outstanding[r["worker"]] -= 1
                r.update(start=start - self.t0, end=end - self.t0, batch=nb)
                self.got += 1
                if self.closed is not None:
                    nxt.append(self.next_closed())
        return nxt

    def dispatch(self) -> None:
        """The launcher thread's sends: each client's first request at time zero (closed loop), or
        every request at its arrival time (open loop; it stops early if the receiver ended)."""
        if self.closed is not None:
            while time.perf_counter() < self.t0:
                time.sleep(0.001)
            for _ in range(self.clients):
                r = self.next_closed()
                if r is not None:
                    self.send(r, time.perf_counter() - self.t0)
            return
        for r in self.requests:
            while (wait := self.t0 + r.arrival - time.perf_counter()) > 0:
                self.pool.stop()
                time.sleep(min(wait, POLL_S))
            self.send(r, r.arrival)
            if self.done.is_set():
                break
