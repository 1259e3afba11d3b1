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
from dataclasses import dataclass
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
    batch's end), and the others' time from when they could start (their last dispatch, or the
    previous batch's end if later) to their start: an upper bound on the overhead, holding the hop
    from the launcher and a dynamic batch's wait for more."""
    waited, other = [], []
    prev_end = None
    for start, end, dispatch, n in batches:
        if prev_end is not None and dispatch <= prev_end and n >= batch_max:
            waited.append(max(0.0, start - prev_end))
        else:
            other.append(max(0.0, start - max(dispatch, prev_end if prev_end is not None else dispatch)))
        prev_end = end
    return waited, other


@dataclass(frozen=True)
class Process:
    """One serving process's cycle over a cell: requests, forward seconds, forward plus one gap per
    batch, and the gap's estimate (None without any gap)."""

    worker: Any
    requests: int
    forward_s: float
    cycle_s: float
    gap_s: float | None

    @property
    def capacity(self) -> float:
        return self.requests / self.cycle_s if self.cycle_s > 0 else 0.0


def processes(rows: list[dict[str, Any]], batch_max: int = 1) -> list[Process]:
    """Each process's cycle (:class:`Process`) from the cell's request rows."""
    out = []
    for worker, batches in sorted(_batches(rows).items(), key=lambda kv: str(kv[0])):
        waited, other = gaps(batches, batch_max)
        gap = float(np.mean(waited)) if waited else (float(np.median(other)) if other else None)
        forward = sum(end - start for start, end, _, _ in batches)
        out.append(Process(worker, sum(n for *_, n in batches), forward, forward + (gap or 0.0) * len(batches), gap))
    return out


def limit(rows: list[dict[str, Any]], wall_s: float, *, achieved_rps: float | None, batch_max: int = 1,
          gpu_util_pct: float | None = None, slowed: bool = False, pipeline: bool = False,
          graphs: bool = False) -> dict[str, Any]:
    """The cell's ``serve_gap_mean_s`` (harness time between batches), ``serve_capacity_rps`` (what
    its processes would serve if never idle) and ``serve_limit`` (what limits it, in words).
    ``slowed``: a process sleeps on purpose inside its forward (``--slow``); ``graphs``: its forward
    is replayed from CUDA graphs, so few kernel launches are left on the host's side of it."""
    if pipeline or not rows or not wall_s > 0:
        return {}
    procs = processes(rows, batch_max)
    capacity = sum(p.capacity for p in procs)
    known = [p.gap_s for p in procs if p.gap_s is not None]
    out: dict[str, Any] = {"serve_gap_mean_s": float(np.mean(known)) if known else None,
                           "serve_capacity_rps": capacity or None}
    busy = {p.worker: p.cycle_s / wall_s for p in procs}
    full = [p for p in procs if busy[p.worker] >= SATURATED]
    if not full and achieved_rps is not None and capacity > 0 and achieved_rps >= SATURATED * capacity:
        full = procs
    if not full:
        return {**out, "serve_limit_kind": "offered rate",
                "serve_limit": f"the offered rate: processes busy {_pcts(busy.values())} of the time, capacity "
                               f"about {capacity:.0f} req/s"}
    forward, cycle = sum(p.forward_s for p in full), sum(p.cycle_s for p in full)
    requests = sum(p.requests for p in full)
    share, cyc_ms = forward / cycle, cycle / requests * 1e3
    fwd_ms = share * cyc_ms
    where = "" if len(full) == len(procs) else (
        f"process {', '.join(str(p.worker) for p in full)} at capacity, the others busy "
        f"{_pcts(busy[p.worker] for p in procs if p not in full)} (uneven load: jsq or shared balance it); ")
    if share >= FORWARD_SHARE:
        kind, text = "forward", (f"{where}the forward: {fwd_ms:.2f} ms of each {cyc_ms:.2f} ms cycle a request "
                                 f"({share:.0%}), capacity about {capacity:.0f} req/s")
        if slowed:
            text += "; the forward holds the delay --slow adds"
        elif gpu_util_pct is not None and gpu_util_pct < LAUNCH_BOUND_PCT:
            why = (": the rest of a forward is the host's work around its graph replay (the input copied in, the "
                   "answer copied back and waited for)" if graphs else ", so the host's kernel launches set the pace")
            text += (f"; the GPU ran kernels {gpu_util_pct:.0f}% of the time (NVML){why}: dynamic batching "
                     "(--policy batch) serves more")
    else:
        kind, text = "harness", (f"{where}the harness: {cyc_ms - fwd_ms:.2f} ms a request between batches (queue "
                                 f"hop, inputs, answers) against {fwd_ms:.2f} ms of forward, capacity about "
                                 f"{capacity:.0f} req/s; dynamic batching (--policy batch) spreads it")
    return {**out, "serve_limit": text, "serve_limit_kind": kind}


def _pcts(values) -> str:
    """Shares as one percentage, or a range of them."""
    v = sorted(values)
    if not v:
        return "-"
    return f"{v[0]:.0%}" if f"{v[0]:.0%}" == f"{v[-1]:.0%}" else f"{v[0]:.0%}-{v[-1]:.0%}"
