"""What limits a serving cell's throughput: the model's forward, the harness around it, or the
offered rate.

A serving process repeats one cycle: take the next batch off its queue and build its inputs, run
the forward (``start`` to ``end`` of the request rows: the copy of the answer to the host waits for
the device), send the answers. Between two batches it is either idle (nothing had arrived) or
paying the harness's overhead (the queue hop, unpickling, building inputs, sending answers). The
gaps before batches that were waiting whole (every request dispatched before the previous batch
ended, and a dynamic batch full, so it did not wait for more: that wait is the policy's choice)
measure that overhead. A process's capacity is then its requests over its forward time plus one
such gap per batch: what it would serve at this cell's batch sizes if it were never idle. Where
no batch waited (a cell below capacity), the gap is the time from the last dispatch to the start
of batches that found the process idle, which also holds the launcher-to-process hop and a
dynamic batch's wait: an upper bound.

Pipelines are left out: their stages overlap, so one process's cycle is not the cell's.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np

#: A cell whose processes were busy (forward plus overhead) at least this share of its wall time,
#: or that answered at least this share of its capacity, ran at capacity.
SATURATED = 0.85
#: At capacity, the forward limits when it is at least this share of a cycle; below, the harness does.
FORWARD_SHARE = 0.5
#: NVML's GPU utilisation (% of time a kernel ran) below which a forward-bound GPU cell is said to be
#: paced by the host's kernel launches rather than by the GPU.
LAUNCH_BOUND_PCT = 70.0


def _batches(rows: list[dict[str, Any]]) -> dict[Any, list[tuple[float, float, float, int]]]:
    """Per process, its batches in order: (start, end, latest dispatch, requests)."""
    by: dict[tuple[Any, float], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        by[(r["worker"], r["start_s"])].append(r)
    out: dict[Any, list[tuple[float, float, float, int]]] = defaultdict(list)
    for (worker, start), rs in by.items():
        out[worker].append((start, max(r["end_s"] for r in rs), max(r["dispatch_s"] for r in rs), len(rs)))
    for b in out.values():
        b.sort()
    return out


def gaps(batches: list[tuple[float, float, float, int]], batch_max: int = 1) -> tuple[list[float], list[float]]:
    """A process's gaps before the batches that were waiting whole for it (start minus the previous
    batch's end), and its dispatch-to-start times of batches that found it idle."""
    waited, idle = [], []
    prev_end = None
    for start, end, dispatch, n in batches:
        if prev_end is not None and dispatch <= prev_end and n >= batch_max:
            waited.append(max(0.0, start - prev_end))
        else:
            idle.append(max(0.0, start - dispatch))
        prev_end = end
    return waited, idle


def limit(rows: list[dict[str, Any]], wall_s: float, *, achieved_rps: float | None, batch_max: int = 1,
          gpu_util_pct: float | None = None, pipeline: bool = False) -> dict[str, Any]:
    """The cell's ``serve_gap_mean_s`` (harness time between batches), ``serve_capacity_rps`` (what
    its processes would serve if never idle) and ``serve_limit`` (what limits it, in words)."""
    if pipeline or not rows or not wall_s > 0:
        return {}
    per = _batches(rows)
    capacity = forward = cycle = 0.0
    waited_all: list[float] = []
    idle_all: list[float] = []
    for batches in per.values():
        waited, idle = gaps(batches, batch_max)
        waited_all += waited
        idle_all += idle
        gap = float(np.mean(waited)) if waited else (float(np.median(idle)) if idle else 0.0)
        busy = sum(end - start for start, end, _, _ in batches)
        own = busy + gap * len(batches)
        if own > 0:
            capacity += sum(n for *_, n in batches) / own
        forward, cycle = forward + busy, cycle + own
    gap_mean = float(np.mean(waited_all)) if waited_all else (float(np.median(idle_all)) if idle_all else None)
    out: dict[str, Any] = {"serve_gap_mean_s": gap_mean, "serve_capacity_rps": capacity or None}
    if not cycle > 0:
        return out
    share, busy_frac = forward / cycle, cycle / (wall_s * len(per))
    at_capacity = busy_frac >= SATURATED or (achieved_rps is not None and achieved_rps >= SATURATED * capacity)
    cyc_ms = cycle / sum(len(b) for b in per.values()) * 1e3
    fwd_ms = share * cyc_ms
    if not at_capacity:
        kind, text = "offered rate", (f"the offered rate: processes busy {busy_frac:.0%} of the time, capacity "
                                      f"about {capacity:.0f} req/s")
    elif share >= FORWARD_SHARE:
        kind, text = "forward", (f"the forward: {fwd_ms:.2f} ms of each {cyc_ms:.2f} ms batch cycle ({share:.0%}), "
                                 f"capacity about {capacity:.0f} req/s")
        if gpu_util_pct is not None and gpu_util_pct < LAUNCH_BOUND_PCT:
            text += (f"; the GPU ran kernels {gpu_util_pct:.0f}% of the time (NVML), so the host's kernel launches "
                     "set the pace: dynamic batching (--policy batch) or a compiled model serve more")
    else:
        kind, text = "harness", (f"the harness: {cyc_ms - fwd_ms:.2f} ms between batches (queue hop, inputs, "
                                 f"answers) against {fwd_ms:.2f} ms of forward, capacity about {capacity:.0f} req/s; "
                                 "dynamic batching (--policy batch) spreads it")
    return {**out, "serve_limit": text, "serve_limit_kind": kind}
