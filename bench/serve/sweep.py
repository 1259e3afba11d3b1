"""MLPerf Server scenario: the highest Poisson rate whose p99 latency meets a target.

Rates are tried in ascending order (``--sweep-rates``, or a geometric ladder from the lowest load
level); the first failing rate ends the ladder, then three bisection steps between the last passing
and the first failing rate narrow it. A rate passes when its p99 is reported (enough requests: the
early-stopping rule refuses a p99 of fewer than 662) and within the target, the cell kept up with
the rate its requests arrived at (answered >= 90% of it per second), and its backlog was steady (no
steady-state flag: it did not grow over the cell, drained in about one latency, Little's law held):
a saturated server's latency grows with the run's length, so a short run could otherwise pass a rate
it cannot sustain. The rule compares with the realised rate, not the nominal one: a seeded
Poisson draw can itself fall about 5% short of the nominal rate (a steady 3,856 req/s batching point
on 4 H100s answered 89.99% of nominal and 94.9% of what arrived).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from bench.serve.config import Load, ServeConfig

BISECT_STEPS = 3


def passed(row: dict[str, Any]) -> bool:
    return row.get("status") == "ok" and bool(row.get("slo_met"))


def run_sweep(cell: Callable[[Load], dict[str, Any]], cfg: ServeConfig, sm: Any) -> dict[str, Any]:
    """Run the sweep's cells through ``cell`` (which writes each); returns what it found."""
    tried: list[tuple[float, bool, float | None]] = []
    best, first_fail = None, None
    for rate in cfg.sweep_ladder():
        row = cell(cfg.sweep_loads([rate])[0])
        ok = passed(row)
        tried.append((rate, ok, row.get("latency_p99_s")))
        if ok:
            best = rate
        else:
            first_fail = rate
            break
    lo, hi = best, first_fail
    for _ in range(BISECT_STEPS if lo is not None and hi is not None else 0):
        mid = (lo + hi) / 2  # type: ignore[operator]
        row = cell(cfg.sweep_loads([mid])[0])
        ok = passed(row)
        tried.append((mid, ok, row.get("latency_p99_s")))
        lo, hi = (mid, hi) if ok else (lo, mid)
    best = lo
    return {"slo_p99_s": cfg.slo_ms / 1e3, "max_rate_rps": best, "first_failing_rps": hi,
            "tried": [{"rate": r, "pass": ok, "p99_s": p} for r, ok, p in tried],
            "note": None if best is not None else "no rate tried met the target (or p99 was refused: too few requests)"}
