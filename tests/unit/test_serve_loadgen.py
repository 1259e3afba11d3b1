"""Load generation: seeded, the asked-for rates and burstiness, heavy tails, tenants independent."""

from __future__ import annotations

import numpy as np
import pytest

from bench.core.errors import UserError
from bench.serve.loadgen import Tenant, closed_sizes, parse_tenants, schedule


def _gaps(reqs):
    return np.diff([r.arrival for r in reqs])


def test_same_seed_same_schedule_other_seed_other():
    t = [Tenant(rate=50.0)]
    a, b = schedule(t, seed=1, duration_s=10), schedule(t, seed=1, duration_s=10)
    c = schedule(t, seed=2, duration_s=10)
    assert a == b
    assert [r.arrival for r in a] != [r.arrival for r in c]
    assert [r.rid for r in a] == list(range(len(a)))


def test_poisson_rate_and_cv():
    reqs = schedule([Tenant(rate=200.0)], seed=0, duration_s=100)
    assert len(reqs) / 100 == pytest.approx(200, rel=0.03)
    g = _gaps(reqs)
    assert g.std() / g.mean() == pytest.approx(1.0, rel=0.05)  # exponential gaps
    assert all(0 <= r.arrival < 100 for r in reqs)


def test_gamma_is_bursty_at_the_same_mean_rate():
    reqs = schedule([Tenant(rate=200.0, arrival="gamma", cv=3.0)], seed=0, duration_s=200)
    g = _gaps(reqs)
    assert len(reqs) / 200 == pytest.approx(200, rel=0.1)
    assert g.std() / g.mean() == pytest.approx(3.0, rel=0.15)


def test_tenants_rates_and_independent_streams():
    a = Tenant(name="a", rate=100.0)
    b = Tenant(name="b", rate=10.0)
    both = schedule([a, b], seed=3, duration_s=50)
    n_a = sum(r.tenant == "a" for r in both)
    n_b = sum(r.tenant == "b" for r in both)
    assert n_a / n_b == pytest.approx(10, rel=0.2)
    assert [r.arrival for r in both] == sorted(r.arrival for r in both)
    # adding a tenant moves nobody else's arrivals
    alone = [r.arrival for r in schedule([a], seed=3, duration_s=50)]
    assert [r.arrival for r in both if r.tenant == "a"] == alone


@pytest.mark.parametrize("dist", ["pareto", "lognormal"])
def test_heavy_tailed_sizes_within_bounds(dist):
    reqs = schedule([Tenant(rate=1000.0, size=dist, size_min=4, size_max=512, alpha=1.2)], seed=0, duration_s=20)
    s = np.array([r.size for r in reqs])
    assert s.min() >= 4 and s.max() <= 512
    assert np.median(s) < 16 and s.max() >= 100  # most requests small, a few very large


def test_n_requests_and_closed_loop_sizes():
    reqs = schedule([Tenant(rate=5.0)], seed=0, n_requests=123)
    assert len(reqs) == 123
    cl = closed_sizes([Tenant(name="a"), Tenant(name="b")], seed=0, n=50)
    assert len(cl) == 50 and {r.tenant for r in cl} == {"a", "b"}


def test_parse_tenants_and_its_errors():
    ts = parse_tenants("a:rate=20,size=pareto;b:rate=5,arrival=gamma,cv=4", default=Tenant(size_max=64))
    assert [t.name for t in ts] == ["a", "b"] and ts[0].size == "pareto" and ts[1].cv == 4.0
    assert ts[0].size_max == 64  # from the default
    for bad in ("a:rate=x", "a:speed=3", "a:arrival=uniform", "a;a", "a:rate=-1", ""):
        with pytest.raises(UserError):
            parse_tenants(bad, default=Tenant())
