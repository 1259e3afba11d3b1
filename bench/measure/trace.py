"""Per-collective records and the compute/communication breakdown, from a torch.profiler trace.

A few steps of each cell run under ``torch.profiler`` after the timed steps (so profiling never
touches the timed numbers). From the Chrome trace of each rank:

* **On CUDA** the intervals are GPU kernels: NCCL kernels (name contains ``nccl``) are
  communication, every other kernel, memcpy and memset is compute. A collective's duration is its
  NCCL kernel's duration: it includes the time the kernel waits on the GPU for the slowest peer,
  and excludes host-side queueing before the kernel starts. The kernels come from a pass that
  records GPU activity only; op, bytes and group size from c10d's ``record_param_comms`` records
  of a host-only pass over as many steps (or, in a trace that has both, the record around the
  kernel's launch).
* **Gloo with CUDA tensors**: compute is the GPU kernels, communication Gloo's annotations.
* **On CPU with Gloo** communication is Gloo's own ``gloo:<op>`` annotation (on Gloo's worker
  thread for async ops, on the caller's for blocking ones): it starts when Gloo picks the work up,
  so it includes waiting for peers but not time spent queued behind earlier work. Compute is every
  operator on the other threads, minus the time inside ``c10d::`` calls (the caller launching or
  waiting for communication). Bytes come from the recorded input shapes; the trace does not say
  which process group an op used, so ``group_size`` is empty there.

**The step's window.** On CUDA each profiled step is bracketed by a marker kernel
(:data:`MARKER`, launched on the step's stream at its start and at its end): the window of a step
is the span between its two markers, the step as its stream runs it, which is what the timed steps'
CUDA events bracket. Kernels of the step before that still run inside it count, as they do in a
timed step; the gap between one step's end and the next step's start does not. A collective row
belongs to the profiled steps when it was launched between their first and last markers. A trace
without markers falls back to one window, first to last GPU event.

Breakdown per step (all seconds, averaged over the profiled steps): ``compute_time_s``,
``comm_time_s`` (union of communication intervals), ``overlap_frac`` (|comm & compute| / comm),
``exposed_comm_s`` (comm not hidden behind compute), ``idle_frac`` (time in neither, over the
profiled span; on CPU, Python between operators counts as idle).
"""

from __future__ import annotations

import math
from typing import Any

from bench.core import backends
from bench.core.backends import Backend

GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
#: The marker kernel bench.train.profile launches at the start and the end of each profiled step
#: (``torch.cuda._sleep(0)``, "at::cuda::(anonymous namespace)::spin_kernel(long)": it returns at
#: once, and no model launches it).
MARKER = "::spin_kernel("
Interval = tuple[float, float]

DTYPE_BYTES = {"float": 4, "c10::BFloat16": 2, "c10::Half": 2, "double": 8, "long int": 8, "int": 4,
               "bool": 1, "unsigned char": 1, "signed char": 1, "short int": 2, "Float": 4, "BFloat16": 2,
               "Half": 2, "Double": 8, "Long": 8, "Int": 4, "Byte": 1, "Bool": 1}
COMM_CPU_PREFIXES = ("c10d::", "_c10d_functional", "record_param_comms", "gloo:", "nccl:")


def union(iv: list[Interval]) -> list[Interval]:
    """Sorted, merged intervals."""
    out: list[list[float]] = []
    for a, b in sorted(iv):
        if b <= a:
            continue
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def length(iv: list[Interval]) -> float:
    return sum(b - a for a, b in union(iv))


def intersect(x: list[Interval], y: list[Interval]) -> list[Interval]:
    """Intersection of two interval sets (each merged first)."""
    x, y = union(x), union(y)
    out, i, j = [], 0, 0
    while i < len(x) and j < len(y):
        a, b = max(x[i][0], y[j][0]), min(x[i][1], y[j][1])
        if a < b:
            out.append((a, b))
        if x[i][1] < y[j][1]:
            i += 1
        else:
            j += 1
    return out


def subtract(x: list[Interval], y: list[Interval]) -> list[Interval]:
    """x minus y."""
    out = []
    y = union(y)
    for a, b in union(x):
        cur = a
        for c, d in y:
            if d <= cur or c >= b:
                continue
            if c > cur:
                out.append((cur, c))
            cur = max(cur, d)
        if cur < b:
            out.append((cur, b))
    return out


def breakdown(compute: list[Interval], comm: list[Interval], window: Interval | list[Interval],
              steps: int) -> dict[str, float]:
    """The per-step breakdown from interval sets (seconds in, seconds out) inside ``window``: one
    interval over all ``steps``, or one interval a step."""
    win = [window] if isinstance(window, tuple) else list(window)
    compute, comm = intersect(compute, win), intersect(comm, win)
    span = max(length(win), 1e-12)
    t_comm, t_comp = length(comm), length(compute)
    both = length(intersect(comm, compute))
    busy = length(compute + comm)
    n = max(steps, 1)
    return {"compute_time_s": t_comp / n, "comm_time_s": t_comm / n, "exposed_comm_s": (t_comm - both) / n,
            "overlap_frac": both / t_comm if t_comm > 0 else math.nan, "idle_frac": max(0.0, span - busy) / span,
            "profiled_step_s": span / n}


Marked = tuple[list[Interval], tuple[int | None, int | None]]


def step_windows(gpu: list[dict[str, Any]], steps: int) -> Marked | None:
    """From a trace's GPU events: each profiled step's window (the last ``2 * steps`` markers, in
    start/end pairs; one more, the warm-up step's end marker, may precede them) and the range of
    correlation ids (launch order) between the first and the last of them. None unless the trace
    holds exactly those markers in that order: a trace that lost one would pair a step's end with
    the next one's start."""
    marks = sorted((e for e in gpu if MARKER in e["name"]), key=lambda e: e["ts"])
    if steps < 1 or len(marks) not in (2 * steps, 2 * steps + 1):
        return None
    marks = marks[-2 * steps:]
    corr = [e.get("args", {}).get("correlation") for e in marks]
    if None not in corr and corr != sorted(corr):
        return None
    us = 1e-6
    windows = [((a["ts"] + a["dur"]) * us, b["ts"] * us) for a, b in zip(marks[::2], marks[1::2])]
    if any(b <= a for a, b in windows):
        return None
    return windows, (corr[0], corr[-1])


def in_steps(kernels: list[dict[str, Any]], marked: Marked) -> list[dict[str, Any]]:
    """The kernels the profiled steps launched: correlation id between the first and the last
    marker's; a kernel without one, when it starts inside a step's window."""
    windows, (lo, hi) = marked
    us = 1e-6

    def mine(e: dict[str, Any]) -> bool:
        c = e.get("args", {}).get("correlation")
        if c is not None and lo is not None and hi is not None:
            return lo < c < hi
        return any(a <= e["ts"] * us < b for a, b in windows)

    return [e for e in kernels if mine(e)]


def alone(b: dict[str, float]) -> dict[str, float]:
    """A one-rank step's breakdown: its collectives move nothing (a copy at most), so the time they
    showed up as is the step's own work: exposed communication joins compute, none is left."""
    exposed = b.get("exposed_comm_s") or 0.0
    return {**b, "compute_time_s": b.get("compute_time_s", 0.0) + exposed, "comm_time_s": 0.0,
            "exposed_comm_s": 0.0, "overlap_frac": math.nan}


def _dims_bytes(args: dict[str, Any]) -> float | None:
    dims, types = args.get("Input Dims"), args.get("Input type")
    if not dims or not types:
        return None
    first = dims[0]
    while first and isinstance(first[0], list):  # TensorList: [[[n]]]
        first = first[0]
    size = DTYPE_BYTES.get(types[0])
    if size is None or not isinstance(first, list):
        return None
    return float(math.prod(first) * size)


def _param_comms(e: dict[str, Any]) -> dict[str, Any]:
    a = e.get("args", {})
    nelems = a.get("In msg nelems") or a.get("In msg size")
    size = DTYPE_BYTES.get(str(a.get("dtype")), None)
    return {"op": a.get("Collective name"), "group_size": a.get("Group size"),
            "bytes": float(nelems) * size if (nelems is not None and size) else None}


def analyze_trace(trace: dict[str, Any], device_type: str, steps: int, backend: Backend | str = "nccl", *,
                  records: dict[str, Any] | None = None) -> tuple[dict[str, float], list[dict]]:
    """(breakdown, collective rows) of one rank's Chrome trace. Timestamps are microseconds. How a
    backend's communication shows up (GPU kernels or host spans) comes from the backend registry.

    ``records``, when given, is the trace of a host-only pass over as many steps of the same cell
    (bench.train.profile): the breakdown and the durations come from ``trace``, each collective's op,
    bytes and group size from ``records`` (for NCCL, the k-th kernel of a kind in launch order is the
    k-th record of that kind; a kind whose counts differ keeps the kernel's name and no bytes; for
    Gloo, the k-th span of a name takes the bytes of the k-th span of that name)."""
    be = backends.get(backend) if isinstance(backend, str) else backend
    events = _complete(trace)
    us = 1e-6
    iv = lambda es: [(e["ts"] * us, (e["ts"] + e["dur"]) * us) for e in es]
    is_span = lambda e: e["name"].startswith(be.span_prefixes) if be.span_prefixes else False
    span_rows = lambda: _span_rows([e for e in events if is_span(e)],
                                   [e for e in _complete(records) if is_span(e)] if records else None)
    gpu_all = [e for e in events if e.get("cat") in GPU_CATS]
    marked = step_windows(gpu_all, steps) if device_type == "cuda" else None
    gpu = [e for e in gpu_all if MARKER not in e["name"]]
    if device_type == "cuda" and not be.comm_in_kernels():
        # Host-side backend on CUDA tensors: compute is on the GPU, communication on the backend's
        # host threads (the same clock in the trace).
        spans = [e for e in events if is_span(e)]
        marks = [e for e in events if e["name"] == "parbench_step"]
        if not marks:
            return {}, []
        everything = gpu + spans + marks
        window = marked[0] if marked else (min(e["ts"] for e in everything) * us,
                                           max(e["ts"] + e["dur"] for e in everything) * us)
        return breakdown(iv(gpu), iv(spans), window, steps), span_rows()
    if device_type == "cuda":
        if not gpu:
            return {}, []
        is_comm = lambda e: any(k in e["name"].lower() for k in be.kernel_markers)
        comm_k = [e for e in gpu if is_comm(e)]
        comp_k = [e for e in gpu if not is_comm(e)]
        window = marked[0] if marked else (min(e["ts"] for e in gpu) * us,
                                           max(e["ts"] + e["dur"] for e in gpu) * us)
        bd = breakdown(iv(comp_k), iv(comm_k), window, steps)
        if marked:
            comm_k = in_steps(comm_k, marked)  # the rows: the profiled steps' own collectives
        metas = _metas_by_order(comm_k, records) if records is not None else _metas_by_launch(comm_k, events)
        rows = []
        for k, meta in zip(comm_k, metas):
            if not meta["op"]:
                meta["op"] = _kernel_op(k["name"])
            rows.append({**meta, "start_s": k["ts"] * us, "duration_s": k["dur"] * us, "kernel": k["name"][:80]})
        return bd, rows
    spans = [e for e in events if is_span(e)]
    steps_ev = [e for e in events if e["name"] == "parbench_step"]
    if not steps_ev:
        return {}, []
    window = (min(e["ts"] for e in steps_ev) * us, max(e["ts"] + e["dur"] for e in steps_ev) * us)
    span_only = {e["tid"] for e in spans} - {e["tid"] for e in events if e.get("cat") == "cpu_op"}
    compute: list[Interval] = []
    waits: list[Interval] = []
    for e in events:
        if e.get("cat") != "cpu_op" or e["tid"] in span_only:
            continue
        span = (e["ts"] * us, (e["ts"] + e["dur"]) * us)
        (waits if e["name"].startswith(COMM_CPU_PREFIXES) else compute).append(span)
    compute = subtract(compute, waits)
    return breakdown(compute, iv(spans), window, steps), span_rows()


def has_markers(trace: dict[str, Any], steps: int) -> bool:
    """The trace's GPU events hold the markers of ``steps`` profiled steps (:func:`step_windows`)."""
    return step_windows([e for e in _complete(trace) if e.get("cat") in GPU_CATS], steps) is not None


def has_gpu_events(trace: dict[str, Any]) -> bool:
    """The trace holds device activity (kernels, copies, sets)."""
    return any(e.get("cat") in GPU_CATS for e in trace.get("traceEvents", []))


def _complete(trace: dict[str, Any] | None) -> list[dict[str, Any]]:
    return [e for e in (trace or {}).get("traceEvents", []) if e.get("ph") == "X" and "dur" in e]


def _kernel_op(name: str) -> str:
    return name.split("(")[0].replace("ncclDevKernel_", "").replace("ncclKernel_", "")


# A collective's kind, as c10d names it in record_param_comms and as NCCL names its kernel.
_KINDS = {"allreduce": "allreduce", "allgather": "allgather", "reducescatter": "reducescatter",
          "broadcast": "broadcast", "reduce": "reduce", "alltoall": "alltoall", "send": "sendrecv",
          "recv": "sendrecv", "sendrecv": "sendrecv", "gather": "gather", "scatter": "scatter"}


def _kind(name: str) -> str | None:
    """``allreduce``, ``allgather``... of a record's collective name (``_allgather_base``,
    ``reduce_scatter_tensor_coalesced``) or a kernel's (``ncclDevKernel_AllGather_RING_LL``)."""
    key = name.lower().replace("ncclkernel_", "").replace("nccldevkernel_", "").replace("_", "")
    for suffix in ("tensorcoalesced", "coalesced", "base", "tensor", "into"):
        key = key.replace(suffix, "")
    for kind in sorted(_KINDS, key=len, reverse=True):
        if key.startswith(kind):
            return _KINDS[kind]
    return None


def _metas_by_order(kernels: list[dict[str, Any]], records: dict[str, Any]) -> list[dict[str, Any]]:
    """Each kernel's (op, group size, bytes) from the records pass: the k-th kernel of a kind in launch
    order takes the k-th record of that kind, where both passes have as many of that kind; kernels of
    no known kind, when there are as many kernels as records, take the records in order."""
    recs = sorted((e for e in _complete(records) if e.get("name") == "record_param_comms"), key=lambda e: e["ts"])
    metas = [m for m in map(_param_comms, recs) if m["op"] not in (None, "barrier", "wait")]  # issue order
    # Launch order (the correlation id), which is the order the host issued the records in; start
    # times can interleave two groups' kernels differently.
    order = sorted(range(len(kernels)), key=lambda i: (kernels[i].get("args", {}).get("correlation", math.inf),
                                                       kernels[i]["ts"]))
    kinds = [_kind(_kernel_op(kernels[i]["name"])) for i in order]
    out: list[dict[str, Any]] = [{"op": None, "group_size": None, "bytes": None} for _ in kernels]
    if None in kinds and len(metas) == len(kernels):
        # A kernel of no known kind (NCCL's generic kernels): as many kernels as records, in order.
        for i, meta in zip(order, metas):
            out[i] = dict(meta)
        return out
    by_kind: dict[str | None, list[dict[str, Any]]] = {}
    for meta in metas:
        by_kind.setdefault(_kind(str(meta["op"])), []).append(meta)
    counts = {k: kinds.count(k) for k in set(kinds)}
    taken: dict[str | None, int] = {}
    for i, kind in zip(order, kinds):
        pool = by_kind.get(kind, [])
        if kind is None or len(pool) != counts[kind]:
            continue
        out[i] = dict(pool[taken.get(kind, 0)])
        taken[kind] = taken.get(kind, 0) + 1
    return out


def _metas_by_launch(kernels: list[dict[str, Any]], events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each kernel's (op, group size, bytes) from the same trace: the kernel's launch (by correlation
    id), the ``record_param_comms`` record around that launch."""
    launches = {e["args"].get("correlation"): e for e in events
                if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    records = [e for e in events if e.get("name") == "record_param_comms"]
    out = []
    for k in kernels:
        meta: dict[str, Any] = {"op": None, "group_size": None, "bytes": None}
        launch = launches.get(k.get("args", {}).get("correlation"))
        if launch is not None:
            enclosing = [r for r in records if r["tid"] == launch["tid"] and r["ts"] <= launch["ts"]
                         <= r["ts"] + r["dur"]]
            if enclosing:
                meta = _param_comms(max(enclosing, key=lambda r: r["ts"]))
        out.append(meta)
    return out


def comm_volume(trace: dict[str, Any], backend: Backend | str) -> tuple[int, float]:
    """(calls, bytes) of communication in a trace: the ``record_param_comms`` records c10d writes
    for each collective and point-to-point call (NCCL), else the backend's own spans (Gloo). The
    distribution check reads this; it needs only the CPU side of the trace."""
    be = backends.get(backend) if isinstance(backend, str) else backend
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X"]
    records = [_param_comms(e) for e in events if e.get("name") == "record_param_comms"]
    records = [r for r in records if r["op"] not in (None, "barrier", "wait")]
    if records:
        return len(records), float(sum(r["bytes"] or 0.0 for r in records))
    spans = [e for e in events if be.span_prefixes and e["name"].startswith(be.span_prefixes)
             and not e["name"].endswith(("barrier", "wait"))]
    return len(spans), float(sum(_dims_bytes(e.get("args", {})) or 0.0 for e in spans))


def _span_rows(spans: list[dict[str, Any]], shaped: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """A row per host span: its times, and its bytes from its own input shapes or, given ``shaped``
    (the records pass's spans), from the k-th span of the same name there."""
    by_name: dict[str, list[dict[str, Any]]] = {}
    for e in sorted(shaped or [], key=lambda e: e["ts"]):
        by_name.setdefault(e["name"], []).append(e)
    seen: dict[str, int] = {}
    rows = []
    for e in sorted(spans, key=lambda e: e["ts"]):
        k = seen.get(e["name"], 0)
        seen[e["name"]] = k + 1
        twin = by_name.get(e["name"], [])
        args = (twin[k] if k < len(twin) else {}).get("args", {}) if shaped is not None else e.get("args", {})
        rows.append({"op": e["name"].split(":", 1)[-1], "group_size": None, "bytes": _dims_bytes(args),
                     "start_s": e["ts"] * 1e-6, "duration_s": e["dur"] * 1e-6})
    return rows
