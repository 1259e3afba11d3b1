"""Seeded load generation: who sends what, when.

Open loop: every tenant draws its arrival times in advance (Poisson: exponential gaps at a rate;
bursty: gamma gaps of the same mean rate and a coefficient of variation > 1, so requests come in
clumps) and its request sizes from a distribution (fixed, uniform, or heavy-tailed: Pareto and
lognormal, clipped to the model's limits). The same seed gives the same schedule, whichever
placement or policy then serves it, so cells differ only in how they serve.

Closed loop (``clients=N``) is not a schedule: N clients each send a request when their previous
one returns; the launcher drives it (:mod:`bench.serve.launcher`), drawing sizes from here.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace

import numpy as np

from bench.core.errors import UserError

#: gamma arrivals: the coefficients of variation whose shape 1/cv^2 numpy draws from
CV_MIN, CV_MAX = 0.01, 100.0

ARRIVALS = ("poisson", "gamma")
SIZES = ("fixed", "uniform", "pareto", "lognormal")


@dataclass(frozen=True)
class Request:
    """One request: ``arrival`` in seconds from the start of the cell's load."""

    rid: int
    tenant: str
    arrival: float
    size: int


@dataclass(frozen=True, kw_only=True)
class Tenant:
    """One user population: its arrival process and its request sizes."""

    name: str = "t0"
    rate: float = 10.0  # requests per second (open loop)
    arrival: str = "poisson"
    cv: float = 3.0  # gamma: coefficient of variation of the gaps (1 = Poisson)
    size: str = "fixed"
    size_min: int = 1
    size_max: int = 1
    alpha: float = 1.5  # pareto tail index (smaller: heavier)
    sigma: float = 1.0  # lognormal shape

    def check(self) -> None:
        if self.arrival not in ARRIVALS:
            raise UserError(f"tenant {self.name}: arrival {self.arrival!r} unknown; use one of {', '.join(ARRIVALS)}")
        if self.size not in SIZES:
            raise UserError(f"tenant {self.name}: size {self.size!r} unknown; use one of {', '.join(SIZES)}")
        if not 0 < self.rate < math.inf:
            raise UserError(f"tenant {self.name}: rate {self.rate} must be > 0 requests/s")
        if not 1 <= self.size_min <= self.size_max:
            raise UserError(f"tenant {self.name}: need 1 <= size_min ({self.size_min}) <= size_max ({self.size_max})")
        for key in ("cv", "alpha", "sigma"):  # numpy refuses a shape <= 0; inf or nan draws no finite gap
            if not 0 < getattr(self, key) < math.inf:
                raise UserError(f"tenant {self.name}: {key} {getattr(self, key)} must be a finite number > 0")
        if self.arrival == "gamma" and not CV_MIN <= self.cv <= CV_MAX:  # the shape 1/cv^2 overflows past these
            raise UserError(f"tenant {self.name}: cv {self.cv:g} must be from {CV_MIN:g} to {CV_MAX:g} (1 is Poisson)")


def gaps(rng: np.random.Generator, t: Tenant, n: int) -> np.ndarray:
    """``n`` inter-arrival gaps of mean 1/rate."""
    mean = 1.0 / t.rate
    if t.arrival == "poisson":
        return rng.exponential(mean, n)
    # gamma with shape k has cv = 1/sqrt(k): k = 1/cv^2, scale keeps the mean
    k = 1.0 / t.cv**2
    return rng.gamma(k, mean / k, n)


def sizes(rng: np.random.Generator, t: Tenant, n: int) -> np.ndarray:
    """``n`` request sizes in [size_min, size_max]."""
    lo, hi = t.size_min, t.size_max
    if t.size == "fixed" or lo == hi:
        return np.full(n, hi, dtype=int)
    if t.size == "uniform":
        return rng.integers(lo, hi + 1, n)
    if t.size == "pareto":  # classic Pareto with minimum lo: heavy tail, most requests small
        raw = lo * (1.0 + rng.pareto(t.alpha, n))
    else:
        raw = lo * rng.lognormal(0.0, t.sigma, n)
    return np.clip(np.round(raw), lo, hi).astype(int)


def schedule(tenants: list[Tenant], *, seed: int, duration_s: float | None = None,
             n_requests: int | None = None) -> list[Request]:
    """Every tenant's open-loop arrivals within ``duration_s`` (or the first ``n_requests`` of all
    tenants together), merged in time order and numbered 0..n-1."""
    if (duration_s is None) == (n_requests is None):
        raise ValueError("give exactly one of duration_s and n_requests")
    horizon = duration_s if duration_s is not None else n_requests / sum(t.rate for t in tenants)  # type: ignore[operator]
    merged: list[tuple[float, str, int]] = []
    for i, t in enumerate(tenants):
        t.check()
        rng = np.random.default_rng([seed, i])  # one stream per tenant: adding a tenant moves no other's
        expect = int(horizon * t.rate * 1.5 + 20 * (1 + t.cv if t.arrival == "gamma" else 1))
        times = np.cumsum(gaps(rng, t, expect))
        while times[-1] < horizon * 1.2:  # rare: draw more
            times = np.concatenate([times, times[-1] + np.cumsum(gaps(rng, t, expect))])
        if duration_s is not None:
            times = times[times < duration_s]
        sz = sizes(rng, t, len(times))
        merged += [(float(a), t.name, int(s)) for a, s in zip(times, sz)]
    merged.sort()
    if n_requests is not None:
        merged = merged[:n_requests]
    return [Request(rid=i, tenant=name, arrival=a, size=s) for i, (a, name, s) in enumerate(merged)]


def closed_sizes(tenants: list[Tenant], *, seed: int, n: int) -> list[Request]:
    """Sizes and tenants for a closed loop (arrival times are filled in as clients send)."""
    rng = np.random.default_rng([seed, 10_000])
    pick = rng.integers(0, len(tenants), n)
    out = []
    for i, k in enumerate(pick):
        t = tenants[int(k)]
        out.append(Request(rid=i, tenant=t.name, arrival=float("nan"), size=int(sizes(rng, t, 1)[0])))
    return out


_TENANT = re.compile(r"^\s*([A-Za-z0-9_.-]+)\s*(?::(.*))?$")


def parse_tenants(text: str, *, default: Tenant) -> list[Tenant]:
    """``"a:rate=50,size=pareto;b:rate=5,arrival=gamma,cv=4"`` -> tenants; fields not given come
    from ``default`` (the command's --rate, --arrival, --size...)."""
    out = []
    for part in [p for p in text.split(";") if p.strip()]:
        m = _TENANT.match(part)
        if not m:
            raise UserError(f"--tenants item {part!r} must be NAME[:key=value,...], e.g. a:rate=20,size=pareto")
        fields: dict[str, object] = {"name": m.group(1)}
        for kv in [x for x in (m.group(2) or "").split(",") if x.strip()]:
            k, eq, v = kv.partition("=")
            k = k.strip()
            if not eq or k not in Tenant.__dataclass_fields__ or k == "name":
                raise UserError(f"--tenants {m.group(1)}: {kv!r} is not key=value with a key of "
                                f"{', '.join(f for f in Tenant.__dataclass_fields__ if f != 'name')}")
            typ = type(getattr(default, k))
            try:
                fields[k] = typ(v.strip())
            except ValueError:
                raise UserError(f"--tenants {m.group(1)}: {k}={v!r} is not a {typ.__name__}") from None
        t = replace(default, **fields)  # type: ignore[arg-type]
        t.check()
        out.append(t)
    if not out:
        raise UserError("--tenants is empty; pass e.g. 'a:rate=20;b:rate=5'")
    if len({t.name for t in out}) != len(out):
        raise UserError("--tenants names a tenant twice; give each a distinct name")
    return out
