"""The launcher: starts a placement's processes once, then drives cells of load through them.

A :class:`Pool` is one placement on ``world`` devices: its processes stay up across the cells that
share it (every policy and load level), so a cell costs its load, not a model build. For each cell
the launcher sends ``begin`` to every process, dispatches requests at their arrival times (open
loop: a late launcher still counts latency from the scheduled arrival, so it cannot hide queueing)
or as clients get answers (closed loop), collects the answers on a receiver thread (which keeps the
outstanding counts join-shortest-queue reads) and ends the cell with sentinels.
"""

from __future__ import annotations

import multiprocessing as mp
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from bench.serve.loadgen import Request
from bench.serve.policies import SHARED, Pinned, Router, make_router
from bench.serve.worker import WorkerSpec, main

PLACEMENTS = ("replicas", "dataparallel-infer", "pinned-tenants", "pipeline")


class ServeError(RuntimeError):
    """A process failed or a cell did not finish in time; the message says which."""


@dataclass
class CellResult:
    """What one cell produced: per-request records and per-process stats."""

    records: list[dict[str, Any]]
    workers: dict[int, dict[str, Any]]
    t0: float  # perf_counter of the cell's time zero
    t0_unix: float
    wall_s: float
    lag_max_s: float = 0.0  # how late the launcher dispatched its latest request
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
    """The processes of one placement, started once (spawned: CUDA cannot fork)."""

    def __init__(self, placement: str, world: int, devices: list[str], base: dict[str, Any], *,
                 start_timeout_s: float = 300.0):
        self.placement, self.world = placement, world
        ctx = mp.get_context("spawn")
        self.specs = specs(placement, world, devices, base)
        self.result_q = ctx.Queue()
        self.own = [ctx.Queue() for _ in self.specs]
        self.shared_q = ctx.Queue() if placement == "replicas" else None
        self.procs = []
        for i, s in enumerate(self.specs):
            # a pipeline stage hands its output to the next stage's queue; the last stage's "next" is
            # stage 0's (generation goes round the stages once per token)
            nxt = self.own[(i + 1) % len(self.specs)] if placement == "pipeline" else None
            p = ctx.Process(target=main, args=(s, self.own[i], self.shared_q, nxt, self.result_q), daemon=True,
                            name=f"parbench-serve-{i}")
            p.start()
            self.procs.append(p)
        ready = 0
        try:
            while ready < len(self.specs):
                msg = self._get(start_timeout_s, "start")
                if msg[0] == "ready":
                    ready += 1
        except BaseException:  # a process that failed to build: stop the others we started
            self.close()
            raise

    @property
    def entries(self) -> int:
        """Processes requests are routed to (replicas: all; one front otherwise)."""
        return len(self.specs) if self.placement in ("replicas", "pinned-tenants") else 1

    def _get(self, timeout: float, what: str) -> tuple:
        deadline = time.monotonic() + timeout
        while True:
            try:
                msg = self.result_q.get(timeout=min(1.0, max(0.01, deadline - time.monotonic())))
            except Exception:  # noqa: BLE001 - queue.Empty: check the processes are alive, then wait on
                dead = [p.name for p in self.procs if not p.is_alive()]
                if dead:
                    raise ServeError(f"{', '.join(dead)} exited during {what}") from None
                if time.monotonic() > deadline:
                    raise ServeError(f"no answer within {timeout:.0f} s during {what}") from None
                continue
            if msg[0] == "error":
                raise ServeError(f"serving process {msg[1]} failed during {what}:\n{msg[2]}")
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
            msg = self._get(timeout, "the parity probe")
            if msg[0] == "probe":
                out[msg[1]] = msg[2]
        return out

    def close(self) -> None:
        for q in self.own:
            try:
                q.put(("quit",))
            except (OSError, ValueError):
                pass
        for p in self.procs:
            p.join(timeout=5)
            if p.is_alive():  # our own child, by its handle: a stuck exit must not hold the run
                p.terminate()
                p.join(timeout=5)
        # Requests still buffered for a process that is gone (a cell past its timeout leaves a
        # backlog) would hold this process at exit: a queue's feeder thread is joined at exit and
        # blocks on a pipe nobody reads (a review's run at 100,000 req/s never exited).
        for q in [*self.own, *([self.shared_q] if self.shared_q is not None else []), self.result_q]:
            q.cancel_join_thread()

    # --- one cell --------------------------------------------------------------------------
    def run_cell(self, *, policy: str, requests: list[Request], clients: int = 0, batch_max: int = 1,
                 batch_wait_s: float = 0.0, slow_s: dict[int, float] | None = None, seed: int = 0,
                 tenants: list[str] = (), timeout_s: float = 600.0, closed_s: float = 0.0) -> CellResult:
        """Serve ``requests`` (open loop at their arrivals; closed loop with ``clients`` when > 0,
        the clients sending no new request after ``closed_s`` seconds when that is > 0)."""
        n = self.entries
        router: Router = Pinned(n, seed, tenants) if self.placement == "pinned-tenants" else \
            make_router(policy if self.placement == "replicas" else "round-robin", n, seed)
        batching = router.batching  # only the batch policy batches: the others serve one request at a time
        source = "shared" if (router.pick("", [0] * n) == SHARED and self.shared_q is not None) else "own"
        cfg = {"source": source, "batch_max": batch_max if batching else 1, "batch_wait_s": batch_wait_s,
               "slow_s": slow_s or {}}
        for q in self.own:
            q.put(("begin", cfg))
        lock = threading.Lock()
        outstanding = [0] * n
        rec: dict[int, dict[str, Any]] = {}
        done = threading.Event()
        failure: list[str] = []
        pending = list(requests)
        t0 = time.perf_counter() + 0.05
        t0_unix = time.time() + 0.05
        lag = [0.0]
        sent = [0]
        stopped = threading.Event()  # closed loop: no request will be sent any more

        def send(r: Request, arrival: float) -> None:
            with lock:
                k = router.pick(r.tenant, outstanding)
                now = time.perf_counter() - t0
                lag[0] = max(lag[0], now - arrival)
                rec[r.rid] = {"rid": r.rid, "tenant": r.tenant, "size": r.size, "arrival": arrival,
                              "dispatch": now, "worker": k}
                if k != SHARED:
                    outstanding[k] += 1
                sent[0] += 1
            (self.shared_q if k == SHARED else self.own[k]).put(("req", r.rid, r.tenant, r.size))

        closed = iter(pending) if clients > 0 else None

        def next_closed() -> Request | None:
            r = next(closed, None)  # type: ignore[arg-type]
            if r is None or (closed_s > 0 and time.perf_counter() - t0 > closed_s):
                stopped.set()
                return None
            return r

        def more() -> bool:
            if closed is None:
                return got_n[0] < len(requests)
            return not (stopped.is_set() and got_n[0] >= sent[0])

        got_n = [0]

        def receive() -> None:
            try:
                while more():
                    msg = self._get(timeout_s, "a cell")
                    if msg[0] != "done":
                        continue
                    nxt = []
                    with lock:
                        for rid, start, end, nb in msg[2]:
                            r = rec[rid]
                            if r["worker"] == SHARED:
                                r["worker"] = msg[1]
                            else:
                                outstanding[r["worker"]] -= 1
                            r.update(start=start - t0, end=end - t0, batch=nb)
                            got_n[0] += 1
                            if closed is not None:
                                nxt.append(next_closed())
                    for r in nxt:  # a closed-loop client sends its next request as soon as it has its answer
                        if r is not None:
                            send(r, time.perf_counter() - t0)
            except Exception as e:  # noqa: BLE001 - reported by the launcher thread
                failure.append(str(e))
            finally:
                done.set()

        rx = threading.Thread(target=receive, name="parbench-serve-rx", daemon=True)
        rx.start()
        if closed is not None:
            while time.perf_counter() < t0:
                time.sleep(0.001)
            for _ in range(clients):
                r = next_closed()
                if r is not None:
                    send(r, time.perf_counter() - t0)
        else:
            for r in pending:
                wait = t0 + r.arrival - time.perf_counter()
                if wait > 0:
                    time.sleep(wait)
                send(r, r.arrival)
                if done.is_set():
                    break
        done.wait(timeout_s)
        if not done.is_set():
            failure.append(f"the cell did not finish within {timeout_s:.0f} s")
        wall = time.perf_counter() - t0
        workers: dict[int, dict[str, Any]] = {}
        if not failure:
            ends = self.shared_q if source == "shared" else None
            for i in range(n):  # one sentinel per entry process (a pipeline's stages pass theirs on)
                (ends or self.own[i]).put(("end",))
            while len(workers) < len(self.specs):
                msg = self._get(timeout_s, "the end of a cell")
                if msg[0] == "ended":
                    workers[msg[1]] = msg[2]
        if failure:
            raise ServeError("; ".join(failure))
        return CellResult(records=sorted(rec.values(), key=lambda r: r["rid"]), workers=workers, t0=t0,
                          t0_unix=t0_unix, wall_s=wall, lag_max_s=lag[0])
