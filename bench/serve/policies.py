"""Balancing policies: which replica a request goes to.

A router sees the launcher's count of each replica's outstanding requests (dispatched, not yet
answered) and picks a replica, or ``SHARED`` (the request goes into one queue that idle replicas
pull from: work stealing, which never needs the counts). Dynamic batching is a replica-side
setting (a replica takes up to ``batch_max`` requests, waiting at most ``batch_wait_s`` after the
first for more); the ``batch`` policy routes like join-shortest-queue and turns batching on.

:func:`simulate` runs a router against simulated replicas with given service times (a discrete
event simulation with no processes and no clock), which is what the policy tests use: it shows
what a policy does to a slow replica without timing anything on a shared CPU.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

POLICIES = ("round-robin", "random", "jsq", "shared", "batch")
SHARED = -1


class Router:
    """Base: ``pick(tenant, outstanding) -> replica index or SHARED``."""

    name = "base"
    batching = False

    def __init__(self, n: int, seed: int = 0):
        self.n = n
        self.rng = np.random.default_rng(seed)

    def pick(self, tenant: str, outstanding: Sequence[int]) -> int:
        raise NotImplementedError


class RoundRobin(Router):
    """Static: replica i gets requests i, i+n, i+2n...; blind to load."""

    name = "round-robin"

    def __init__(self, n: int, seed: int = 0):
        super().__init__(n, seed)
        self.next = 0

    def pick(self, tenant: str, outstanding: Sequence[int]) -> int:
        k = self.next
        self.next = (k + 1) % self.n
        return k


class Random(Router):
    name = "random"

    def pick(self, tenant: str, outstanding: Sequence[int]) -> int:
        return int(self.rng.integers(self.n))


class JoinShortestQueue(Router):
    """The replica with the fewest outstanding requests; ties go to a random one among them (a fixed
    tie-break would favour replica 0 at light load)."""

    name = "jsq"

    def pick(self, tenant: str, outstanding: Sequence[int]) -> int:
        o = np.asarray(outstanding)
        best = np.flatnonzero(o == o.min())
        return int(best[0] if len(best) == 1 else self.rng.choice(best))


class Shared(Router):
    """One queue for all replicas: whichever is idle takes the next request."""

    name = "shared"

    def pick(self, tenant: str, outstanding: Sequence[int]) -> int:
        return SHARED


class Batch(JoinShortestQueue):
    """Join-shortest-queue routing with dynamic batching on the replicas."""

    name = "batch"
    batching = True


class Pinned(Router):
    """Each tenant only ever on its own replica (tenants in order of first appearance, modulo n)."""

    name = "pinned"

    def __init__(self, n: int, seed: int = 0, tenants: Sequence[str] = ()):
        super().__init__(n, seed)
        self.home = {t: i % n for i, t in enumerate(tenants)}

    def pick(self, tenant: str, outstanding: Sequence[int]) -> int:
        if tenant not in self.home:
            self.home[tenant] = len(self.home) % self.n
        return self.home[tenant]


def make_router(policy: str, n: int, seed: int = 0) -> Router:
    cls = {"round-robin": RoundRobin, "random": Random, "jsq": JoinShortestQueue, "shared": Shared,
           "batch": Batch}.get(policy)
    if cls is None:
        raise ValueError(f"policy {policy!r} unknown; use one of {', '.join(POLICIES)}")
    return cls(n, seed)


@dataclass
class SimResult:
    """Per request: replica, start and end (same order as the arrivals given)."""

    replica: np.ndarray
    start: np.ndarray
    end: np.ndarray


def simulate(router: Router, arrivals: Sequence[float], service_s: Sequence[float],
             tenants: Sequence[str] | None = None) -> SimResult:
    """Serve ``arrivals`` (sorted, seconds) on ``len(service_s)`` replicas, replica i taking
    ``service_s[i]`` per request, one at a time, first come first served; routing by ``router``."""
    n = len(service_s)
    tenants = tenants or ["t0"] * len(arrivals)
    queues: list[deque[int]] = [deque() for _ in range(n)]
    shared: deque[int] = deque()
    busy_until = [0.0] * n
    busy = [False] * n
    outstanding = [0] * n
    rep = np.full(len(arrivals), -1)
    start = np.zeros(len(arrivals))
    end = np.zeros(len(arrivals))
    events: list[tuple[float, int, int, int]] = []  # (time, order: 0 = finish before 1 = arrival, id, replica)
    for i, a in enumerate(arrivals):
        heapq.heappush(events, (float(a), 1, i, -1))

    def begin(r: int, now: float) -> None:
        src = queues[r] if queues[r] else shared
        if busy[r] or not src:
            return
        i = src.popleft()
        if rep[i] < 0:
            rep[i] = r
            outstanding[r] += 1
        busy[r], start[i] = True, now
        busy_until[r] = now + service_s[r]
        heapq.heappush(events, (busy_until[r], 0, i, r))

    while events:
        now, kind, i, r = heapq.heappop(events)
        if kind == 1:
            k = router.pick(tenants[i], outstanding)
            if k == SHARED:
                shared.append(i)
                for r2 in range(n):
                    begin(r2, now)
            else:
                rep[i] = k
                outstanding[k] += 1
                queues[k].append(i)
                begin(k, now)
        else:
            end[i], busy[r] = now, False
            outstanding[r] -= 1
            begin(r, now)
    return SimResult(replica=rep, start=start, end=end)
