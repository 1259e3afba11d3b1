"""Serving verdicts: whether a cell reached a steady state, kept up with its arrivals, and met
its latency target. The estimators they read (percentiles, Little's law) are in
:mod:`bench.stats.serving`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

#: A cell is not a steady state when the requests arriving in its last quarter spent this many times
#: longer in the system than those of its first quarter, and longer by more than GROWTH_SPAN of the
#: arrival span: the backlog grew for the whole cell, so its latencies measure the cell's length, not
#: the system. (Time in system, not only time queued before a start: a generating pipeline starts a
#: request at once and then queues its tokens between the stages.)
GROWTH, GROWTH_SPAN = 2.0, 0.1
#: Little's law is read as a flag only from this many requests: over a short cell's trimmed window
#: its two sides differ by chance (simulated, 50 ms service, 36-54 requests a cell:
#: stable cells off by more than 5% in 23% of cells at 60% load, 40% at 90%; 0-1% with ~1000).
LITTLE_MIN_N = 250
#: A cell is not a steady state when its last request finished more than one typical latency (the
#: median time in system of its first quarter of arrivals) plus this fraction of the arrival window
#: after the last arrival: requests were still queued when arrivals stopped. On 4 H100s, a
#: generating pipeline offered 38 req/s for 3 s served 8.6 req/s, its last request done 8.2 s after
#: the last arrival (first quarter 5.1 s), while its backlog only grew 1.7x between quarters (the
#: first quarter was already queued) and 96 requests are too few for Little's law. A steady cell
#: drains within about one latency, however long (simulated: without subtracting it, a
#: no-queue cell of 1.4 s requests in a 5 s window is flagged every time).
DRAIN = 0.25


def steady_flags(arrival: Sequence[float], latency: Sequence[float], little_rel_err: float | None,
                 tolerance: float = 0.05) -> list[str]:
    """Why an open-loop cell's latencies are not those of a steady state (empty: nothing seen): the
    time in system grew from the first quarter of arrivals to the last, the cell drained for longer
    than a typical latency plus DRAIN of its arrival window after arrivals stopped, or Little's law,
    which holds for any steady system, is off by more than ``tolerance`` (read from LITTLE_MIN_N
    requests)."""
    a, w = np.asarray(arrival, float), np.asarray(latency, float)
    flags = []
    if a.size >= 8:
        order = np.argsort(a)
        k = a.size // 4
        early = w[order[:k]]  # time in system of the first quarter of arrivals
        first, last = float(np.mean(early)), float(np.mean(w[order[-k:]]))
        span = float(a.max() - a.min())
        if last > GROWTH * first and last - first > GROWTH_SPAN * span:
            flags.append(f"backlog grew over the cell ({first * 1e3:.0f} -> {last * 1e3:.0f} ms in system): above "
                         "capacity, its latencies grow with the cell's length")
        drain = float(np.max(a + w) - a.max())
        typical = float(np.median(early))  # a steady cell drains in about one
        if span > 0 and drain - typical > DRAIN * span:
            flags.append(f"still draining {drain:.2f} s after the last arrival, {drain - typical:.2f} s "
                         f"({(drain - typical) / span:.0%} of the {span:.2f} s arrival window) beyond a "
                         f"typical latency of {typical:.2f} s: requests were still queued when arrivals stopped")
    if a.size >= LITTLE_MIN_N and little_rel_err is not None and little_rel_err == little_rel_err \
            and little_rel_err > tolerance:
        flags.append(f"Little's law off by {little_rel_err:.0%}: not a steady state")
    return flags


#: A cell kept up when it answered at least this share of the requests that arrived per second.
KEPT_UP = 0.9


def kept_up(achieved_rps: float | None, arrival: Sequence[float], offered_rps: float | None = None) -> bool:
    """The cell answered at least KEPT_UP of the arrival rate it was given: the rate its requests
    actually arrived at ((n - 1) / their arrival window), not the nominal one, which a seeded Poisson
    draw misses by its own sampling error (on 4 H100s the 700-arrival draw came in at
    0.949 of the nominal rate at every rate, since one draw is scaled across rates: against the nominal
    rate every point started 5% down). The nominal rate stands in where the arrivals give no window.
    True when nothing is known to compare."""
    if not achieved_rps:
        return True
    a = np.asarray(arrival, float)
    window = float(a.max() - a.min()) if a.size >= 2 else 0.0
    rate = (a.size - 1) / window if window > 0 else offered_rps
    return not rate or achieved_rps >= KEPT_UP * rate


def meets_target(row: dict, arrival: Sequence[float], slo_s: float, *, open_loop: bool) -> bool:
    """A sweep point passes: its p99 is reported and within ``slo_s`` and, open loop, it kept up with
    the rate its requests arrived at (:func:`kept_up`) and its backlog was steady (``row["stable"]``
    from :func:`steady_flags`: a backlog that grew or did not drain is above capacity whatever a
    short cell's p99 says)."""
    p99 = row.get("latency_p99_s")
    if p99 is None or p99 != p99 or p99 > slo_s:
        return False
    if not open_loop:  # a closed loop sends when its clients are answered: its rate is its achieved rate
        return True
    if not kept_up(row.get("serve_achieved_rps"), arrival, row.get("serve_offered_rps")):
        return False
    return row.get("stable") is not False
