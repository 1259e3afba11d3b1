"""Balancing policies on simulated replicas (no processes, no clock): what each does to a slow one."""

from __future__ import annotations

import numpy as np
import pytest

from bench.serve.policies import (
    SHARED,
    Batch,
    JoinShortestQueue,
    Pinned,
    Random,
    RoundRobin,
    Shared,
    make_router,
    simulate,
)


def _arrivals(rate: float, n: int, seed: int = 0) -> np.ndarray:
    return np.cumsum(np.random.default_rng(seed).exponential(1 / rate, n))


FAST, SLOW = 0.010, 0.050  # seconds per request: replica 1 is five times slower


def _slow_share(router, n=3000, rate=40.0):
    res = simulate(router, _arrivals(rate, n), [FAST, SLOW])
    lat = res.end - _arrivals(rate, n)
    return float(np.mean(res.replica == 1)), float(np.percentile(lat, 99))


def test_jsq_avoids_a_slow_replica_round_robin_does_not():
    rr_share, rr_p99 = _slow_share(RoundRobin(2))
    jsq_share, jsq_p99 = _slow_share(JoinShortestQueue(2, seed=0))
    assert rr_share == pytest.approx(0.5, abs=1e-3)  # blind: half the requests to the slow one
    assert jsq_share < 0.4  # fewer: idle ties split evenly, but a queue behind the slow one sends work away
    assert jsq_p99 < rr_p99 / 5  # round-robin overloads the slow replica (20/s at 20/s capacity)


def test_shared_queue_and_random():
    sh_share, _ = _slow_share(Shared(2))
    rnd_share, _ = _slow_share(Random(2, seed=1))
    assert sh_share < 0.3  # the slow replica pulls only when idle: about its share of capacity
    assert rnd_share == pytest.approx(0.5, abs=0.03)


def test_round_robin_cycles_and_jsq_breaks_ties_at_random():
    rr = RoundRobin(3)
    assert [rr.pick("t", [9, 0, 0]) for _ in range(6)] == [0, 1, 2, 0, 1, 2]
    jsq = JoinShortestQueue(3, seed=0)
    assert jsq.pick("t", [2, 0, 1]) == 1
    assert {jsq.pick("t", [0, 0, 5]) for _ in range(50)} == {0, 1}


def test_pinned_keeps_each_tenant_on_its_device():
    arr = _arrivals(30.0, 600)
    tenants = ["a" if i % 3 else "b" for i in range(len(arr))]
    res = simulate(Pinned(2, tenants=["a", "b"]), arr, [FAST, FAST], tenants)
    got = {t: set(res.replica[[i for i, x in enumerate(tenants) if x == t]]) for t in ("a", "b")}
    assert got == {"a": {0}, "b": {1}}


def test_make_router():
    assert isinstance(make_router("batch", 2), Batch) and make_router("batch", 2).batching
    assert make_router("shared", 2).pick("t", [0, 0]) == SHARED
    with pytest.raises(ValueError):
        make_router("fastest", 2)
