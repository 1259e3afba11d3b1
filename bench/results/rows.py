"""The one place a cell row is built: from the cell's spec, every rank's measurements and the
telemetry samples of its timed window.

Every mode's row (train, serve, collective) starts from its spec through :func:`start_row`
(:mod:`bench.results.identity`, re-exported here), which sets the identity, the outcome in the one
status vocabulary (:func:`bench.core.spec.outcome`) and the wall time. For a
training cell the launcher calls :func:`build_row` when the cell's measurements arrive and
:func:`failure_row` when a cell could not produce them (skipped, crashed, timed out). Columns and
how ranks combine come from the metric registry (:mod:`bench.core.metrics`) and the strategy's
declared metrics. Parity and scaling efficiency need other cells and are computed when a run is
read (:func:`bench.results.store.derive`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from bench.core import backends
from bench.core.memory import error
from bench.core.metrics import Metric
from bench.core.spec import CellSpec, RankMeasurement, outcome
from bench.measure.hardware import cpu_threads, peak_flops
from bench.measure.slowdown import POWER_CAP, THROTTLED
from bench.results.identity import start_row
from bench.stats.steps import slow_rank, slowest_profiled_step, slowest_steps, summarize

#: NVML's energy counter advances in steps (about 12.6 J at a time on H200s), so a short
#: window reads 0 or one step: no energy figure below this many seconds.
ENERGY_MIN_WINDOW_S = 1.0
#: sampled GPU metric -> cell column (mean over the cell's GPUs and its timed window)
TELEMETRY_MEANS = {"gpu_util_pct": "gpu_util_mean", "sm_active_pct": "sm_active_mean",
                   "tensor_active_pct": "tensor_active_mean", "power_w": "power_mean_w",
                   "sm_clock_mhz": "sm_clock_mean_mhz", "temp_c": "gpu_temp_mean_c"}
#: sampled host metric -> cell column (mean over the timed window)
HOST_CONTENTION = {"other_cpu_cores": "host_other_cpu_cores", "load1": "host_load1",
                   "cpu_steal_cores": "host_cpu_steal_cores"}
#: seconds from a timed window within which a host sample stands for a window that holds none
HOST_NEAR_S = 5.0
BREAKDOWN_KEYS = ("compute_time_s", "comm_time_s", "exposed_comm_s", "overlap_frac", "idle_frac", "profiled_step_s",
                  "unprofiled_step_s", "profile_passes", "profile_builds")


def base_row(spec: CellSpec) -> dict[str, Any]:
    """The planned facts every row of this cell carries, whatever happened to it."""
    m = spec.measure
    return start_row(
        spec, status=None, nproc=spec.n_procs, nnodes=spec.nnodes,
        role=spec.role, steps=m.steps, warmup=m.warmup, precision=m.precision, time_cap_s=m.time_cap_s or None,
        global_batch=spec.workload.global_batch, params=spec.workload.params, scaling=spec.scaling,
        repeats=m.repeats, profile_at=m.profile_at if m.profile_steps else None,
        flops_per_sample=spec.workload.flops_per_sample, **spec.training.knobs(), lr=spec.training.lr,
        parity_tol_set=spec.workload.parity_tol, batch_norm=spec.workload.batch_norm,
        precision_policy=spec.precision_policy or None, **spec.labels,
        **{f"option_{k}": v for k, v in spec.options.items()})


def failure_row(spec: CellSpec, *, status: str, reason: str, wall_s: float | None = None) -> dict[str, Any]:
    """A row for a cell that produced no measurements (skipped, failed, timed out)."""
    row = base_row(spec)
    row.update(outcome(status, reason), profile_at=None)  # nothing was profiled
    if spec.memory is not None:  # what the planner predicted, also of a cell that did not fit or ran out
        row.update(spec.memory.columns())
    if wall_s is not None:
        row["cell_wall_s"] = wall_s
    return row


def combine(values: Sequence[Any], how: str) -> Any:
    """Per-rank values of one metric combined as its registry entry says."""
    present = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    if how == "rank0":
        return values[0] if values else None
    if not present:
        return None
    if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in present):
        return present[0]
    if how == "max":
        return max(present)
    if how == "min":
        return min(present)
    if how == "sum":
        return float(sum(present))
    return float(sum(present)) / len(present)  # mean


def telemetry_means(samples: Iterable[dict[str, Any]], spec: CellSpec, window: tuple[float, float]) -> dict:
    """Over one timed window: means of the sampled GPU metrics on the GPUs the cell was planned on,
    and the host's contention (cores busy outside the benchmark, load, stolen CPU); clock
    throttling (thermal, hardware slowdown, power brake), time at the power cap, and other
    processes on the cell's GPUs as the fraction / maximum seen. A window shorter than the sampling
    period may hold no host sample: the nearest one within ``HOST_NEAR_S`` stands for it (a
    machine's load changes slowly; a cell of a few milliseconds on a loaded host was contended too)."""
    t0, t1 = window
    devices = {f"gpu{i}" for i in spec.devices}
    acc: dict[str, list[float]] = {}
    near: dict[str, tuple[float, float]] = {}  # host metric -> (distance to the window, value)
    for s in samples:
        if s.get("node", 0) >= spec.nnodes:  # another machine's GPUs and host: not this cell's
            continue
        host = s["device"] == "host" and s["metric"] in HOST_CONTENTION
        if not t0 <= s["t"] <= t1:
            gap = t0 - s["t"] if s["t"] < t0 else s["t"] - t1
            if host and gap <= HOST_NEAR_S and gap < near.get(s["metric"], (math.inf, 0.0))[0]:
                near[s["metric"]] = (gap, s["value"])
            continue
        if host or (s["device"] in devices and s["metric"] in (*TELEMETRY_MEANS, "throttle_reasons", "other_procs")):
            acc.setdefault(s["metric"], []).append(s["value"])
    for metric, (_, value) in near.items():
        acc.setdefault(metric, [value])
    out = {TELEMETRY_MEANS[m]: sum(v) / len(v) for m, v in acc.items() if m in TELEMETRY_MEANS and v}
    out.update({HOST_CONTENTION[m]: sum(v) / len(v) for m, v in acc.items() if m in HOST_CONTENTION and v})
    if acc.get("throttle_reasons"):
        th = [int(v) for v in acc["throttle_reasons"]]
        out["gpu_throttled_frac"] = sum(bool(v & THROTTLED) for v in th) / len(th)
        out["gpu_power_capped_frac"] = sum(bool(v & POWER_CAP) for v in th) / len(th)
    if acc.get("other_procs"):
        out["gpu_other_procs"] = max(acc["other_procs"])
    return out


def contention(means: dict[str, float], cores: int, own: int = 0) -> str:
    """Why the host or the cell's GPUs were contended while it was measured ('' if they were not).
    ``own``: the cell's own processes, which the load average counts as well: two ranks on two
    cores load them fully by themselves, so the load flags only what runs beyond them."""
    why = []
    if means.get("host_other_cpu_cores", 0.0) >= max(0.5, 0.25 * cores):
        why.append(f"{means['host_other_cpu_cores']:.1f} cores busy outside the benchmark")
    if means.get("host_load1", 0.0) - own > cores:
        why.append(f"load {means['host_load1']:.1f} > {cores} cores"
                   + (f" and the cell's {own} processes" if own else ""))
    if means.get("host_cpu_steal_cores", 0.0) >= 0.1:
        why.append(f"{means['host_cpu_steal_cores']:.1f} cores stolen by the hypervisor")
    if means.get("gpu_other_procs", 0.0) > 0:
        why.append("another process on the cell's GPU")
    if means.get("gpu_throttled_frac", 0.0) > 0.05:
        why.append("GPU clocks throttled (thermal, hardware slowdown or power brake) "
                   f"{means['gpu_throttled_frac']:.0%} of the time")
    return "; ".join(why)


def build_row(spec: CellSpec, repeats: Sequence[Sequence[RankMeasurement]], *, wall_s: float,
              strategy_metrics: Sequence[Metric] = (), expects: Sequence[str] = (),
              telemetry: Sequence[dict[str, float]] = ()) -> tuple[dict[str, Any], list[dict], list[dict]]:
    """(cell row, step rows, comm rows) of one cell from its repeats (each: every rank's measurements)
    and the telemetry means of each repeat's timed window (:func:`telemetry_means`).

    A failure on any rank of any repeat fails the cell with that rank's reason. Otherwise: the step
    time of a step is the maximum over ranks (the slowest rank sets the pace); the statistics and
    noise flags come from :func:`bench.stats.steps.summarize` over the repeats (median over repeats, an
    interval from repeat medians when there are 3 or more); throughput = global batch / median; MFU
    only where the GPU's peak is known; energy only over windows of at least
    ``ENERGY_MIN_WINDOW_S``; the breakdown, the distribution evidence and the strategy's metrics come
    from the first repeat (the only one profiled); declared metrics combine over ranks as declared,
    undeclared values go to ``extras`` under ``<strategy>.<key>``. A non-finite loss, or a
    multi-device cell without the evidence its strategy ``expects`` (:func:`distribution_check`),
    fails the cell with the reason; its measurements stay in the row.
    """
    unusable = _unusable(repeats)
    if unusable:
        return failure_row(spec, status="failed", reason=unusable, wall_s=wall_s), [], []
    ranks = repeats[0]
    per_step = [slowest_steps([r.times for r in rep]) for rep in repeats]
    row = base_row(spec)
    row.update(_timing_columns(spec, repeats, per_step, wall_s))
    row.update(_comm_columns(spec, ranks))
    row.update(memory_columns(spec, ranks))
    row.update(_health(spec, repeats, expects))
    _window_columns(row, spec, repeats, per_step, telemetry)
    _breakdown_columns(row, ranks)
    row.update(placement_columns(ranks, backend=spec.backend))
    parity = [r.self_parity for r in ranks if r.self_parity is not None]
    if parity:
        row["parity_rel_err"] = parity[0]
    rounding = [r.parity_rounding for r in ranks if r.parity_rounding is not None]
    if rounding:
        row["parity_rounding"] = rounding[0]
    row.update(_strategy_columns(spec, ranks, strategy_metrics, row))
    steps = [s for k, rep in enumerate(repeats) for s in step_rows(spec, rep, repeat=k)]
    comm = [{"cell_id": spec.cell_id, "rank": r.rank, "backend": spec.backend, "world_size": spec.n_devices, **c}
            for r in ranks for c in r.comm]
    return row, steps, comm


def _unusable(repeats: Sequence[Sequence[RankMeasurement]]) -> str:
    """Why the repeats give no row of measurements ('' when they do): none measured, a rank failed,
    or the ranks timed different numbers of steps."""
    if not repeats:
        return "no repeat was measured"
    for k, ranks in enumerate(repeats):
        failed = [r for r in ranks if r.status != "ok"]
        if failed:
            first = min(failed, key=lambda r: r.rank)
            where = f"repeat {k}, " if len(repeats) > 1 else ""
            return f"{where}rank {first.rank}: {first.reason}"
        counts = sorted({len(r.times) for r in ranks})
        if len(counts) != 1 or counts[0] < 1:
            return f"ranks timed {counts} steps in repeat {k}; they must agree"
    return ""


def _timing_columns(spec: CellSpec, repeats: Sequence[Sequence[RankMeasurement]], per_step: list[np.ndarray],
                    wall_s: float) -> dict[str, Any]:
    """The outcome (ok) and the step-time columns: statistics, throughput, MFU, memory, loss, the
    cell's time outside its timed steps, the slow rank (which also makes the cell unstable)."""
    ranks = repeats[0]
    stats = summarize(per_step)
    median = stats["step_time_median_s"]
    tput = spec.workload.global_batch / median if median > 0 else math.nan
    gpu_name = ranks[0].gpu_name
    peak = peak_flops(gpu_name, spec.measure.precision) if gpu_name else None
    flops = spec.workload.flops_per_sample
    mfu = flops * tput / (peak * spec.n_devices) if (peak and flops) else None
    final = sum(r.losses[-1] * r.loss_weight for r in ranks if r.loss_weight and r.losses)
    mems = [r.peak_mem for r in ranks if r.peak_mem is not None]
    profile_s = max(r.profile_s for r in ranks)
    timed_total = float(sum(x.sum() for x in per_step))
    reached = [r.target_reached for rep in repeats for r in rep[:1]]
    slow = slow_rank(np.array([r.times for r in ranks]))
    cols = dict(**outcome("ok", ""), **stats, throughput_samples_s=tput, mfu=mfu,
                peak_mem_bytes=max(mems) if mems else None, loss_final=final, gpu_name=gpu_name,
                cell_wall_s=wall_s, overhead_s=wall_s - timed_total - profile_s, profile_s=profile_s,
                warmup_steps_done=ranks[0].warmup_steps, slow_rank=slow,
                compile_s=max((r.compile_s for r in ranks if r.compile_s is not None), default=None),
                compiled_graphs=ranks[0].compiled_graphs, graph_breaks=ranks[0].graph_breaks,
                target_reached=None if any(x is None for x in reached) else all(reached))
    if slow is not None:
        cols["noise"] = "; ".join(x for x in (cols.get("noise"), f"rank {slow} slow") if x)
        cols["stable"] = False
    return cols


def _comm_columns(spec: CellSpec, ranks: Sequence[RankMeasurement]) -> dict[str, Any]:
    """Collective calls and bytes per step (mean over ranks) and the largest rank's parameter share."""
    calls = [r.comm_calls_per_step for r in ranks if r.comm_calls_per_step is not None]
    nbytes = [r.comm_bytes_per_step for r in ranks if r.comm_bytes_per_step is not None]
    cols: dict[str, Any] = dict(comm_calls_per_step=sum(calls) / len(calls) if calls else None,
                                comm_bytes_per_step=sum(nbytes) / len(nbytes) if nbytes else None)
    numels = [r.param_numel for r in ranks if r.param_numel is not None]
    if numels and spec.workload.params:
        cols["param_share"] = max(numels) / spec.workload.params
    return cols


def memory_columns(spec: CellSpec, ranks: Sequence[RankMeasurement]) -> dict[str, Any]:
    """The memory model's prediction for the cell (planned) beside what its fullest rank measured:
    the allocator's reserved peak, what NVML saw the process use, the bytes of parameters,
    gradients and optimizer state counted on the rank, and the prediction's error against the
    allocated peak (``peak_mem_bytes``) and the reservation."""
    cols: dict[str, Any] = dict(peak_reserved_bytes=combine([r.peak_reserved for r in ranks], "max"),
                                nvml_process_bytes=combine([r.nvml_process for r in ranks], "max"),
                                held_params_bytes=combine([r.held_params for r in ranks], "max"),
                                held_grads_bytes=combine([r.held_grads for r in ranks], "max"),
                                held_optimizer_bytes=combine([r.held_state for r in ranks], "max"))
    fp = spec.memory
    if fp is None:
        return cols
    cols.update(fp.columns())
    measured = combine([r.peak_mem for r in ranks], "max")
    cols["mem_pred_error"] = None if fp.lower_bound else error(fp.allocated, measured)
    cols["mem_pred_reserved_error"] = None if fp.lower_bound else error(fp.reserved, cols["peak_reserved_bytes"])
    cols["mem_pred_process_error"] = None if fp.lower_bound else error(fp.process, cols["nvml_process_bytes"])
    return cols


def _health(spec: CellSpec, repeats: Sequence[Sequence[RankMeasurement]], expects: Sequence[str]) -> dict[str, Any]:
    """The failed outcome of a cell that measured but did not train as it should (a non-finite loss,
    or no evidence of the distribution its strategy expects); empty when it did."""
    nonfinite = [(k, r.rank) for k, rep in enumerate(repeats) for r in rep
                 if r.loss_weight and any(not math.isfinite(x) for x in r.losses)]
    if nonfinite:
        k, bad = nonfinite[0]
        return outcome("failed", f"rank {bad}: loss is NaN or infinite "
                                 f"(step {_first_bad(repeats[k], bad)}{f', repeat {k}' if k else ''})")
    not_distributed = distribution_check(spec, repeats[0], expects)
    if not_distributed:
        return outcome("failed", not_distributed)
    if spec.training.ac != "none" and not any(r.checkpointed for r in repeats[0]):
        return outcome("failed", f"ac={spec.training.ac}, but no rank ran a forward under activation checkpointing: "
                                 "the strategy does not apply it (strategies.training.prepare_blocks)")
    graphs = [r.compiled_graphs for r in repeats[0]]
    if spec.training.compile == "on" and not all(graphs):
        return outcome("failed", f"compile=on, but torch.compile built no graph on rank "
                                 f"{next(r.rank for r in repeats[0] if not r.compiled_graphs)}: the cell ran eager")
    if spec.training.compile == "on":
        return _recompiled(repeats)
    return {}


def _recompiled(repeats: Sequence[Sequence[RankMeasurement]]) -> dict[str, Any]:
    """The failed outcome of a compiled cell whose timed steps were not the compiled steps: graphs
    built during them (recompiles), or code dynamo gave up on after its recompile limit (eager)."""
    for k, rep in enumerate(repeats):
        for r in rep:
            where = f"rank {r.rank}{f', repeat {k}' if k else ''}"
            if r.recompile_limit:
                return outcome("failed", f"compile=on, but torch.compile reached its recompile limit on {where}: "
                                         "part of the model ran eager (TORCH_LOGS=recompiles names the failing guard)")
            if r.timed_graphs:
                return outcome("failed", f"compile=on, but torch.compile built {r.timed_graphs} graphs during the "
                                         f"timed steps on {where}: they timed recompilation "
                                         "(TORCH_LOGS=recompiles names the failing guard)")
    return {}


def _window_columns(row: dict[str, Any], spec: CellSpec, repeats: Sequence[Sequence[RankMeasurement]],
                    per_step: list[np.ndarray], telemetry: Sequence[dict[str, float]]) -> None:
    """Into ``row``: the timed window, energy over it (long enough windows on CUDA), the telemetry
    means and the host's contention, which makes the cell unstable."""
    windows = [rep[0].window for rep in repeats if rep[0].window is not None]
    if not windows:
        return
    row.update(timed_start_unix=windows[0][0], timed_end_unix=windows[-1][1])
    energies = [r.energy_j for rep in repeats for r in rep]
    span = sum(t1 - t0 for t0, t1 in windows)
    if spec.device == "cuda" and all(e is not None for e in energies) and span >= ENERGY_MIN_WINDOW_S:
        energy = float(sum(energies))
        samples_done = sum(x.size for x in per_step) * spec.workload.global_batch
        row.update(energy_j=energy, energy_per_sample_j=energy / samples_done,
                   samples_per_j=samples_done / energy if energy > 0 else None)
    for key in {k for m in telemetry for k in m}:
        vals = [m[key] for m in telemetry if key in m]
        row[key] = max(vals) if key == "gpu_other_procs" else sum(vals) / len(vals)
    row["contended"] = contention(row, cpu_threads(), own=spec.n_procs)
    if row["contended"]:
        row["stable"] = False
        row["noise"] = "; ".join(x for x in (row.get("noise"), f"contended: {row['contended']}") if x)


def _breakdown_columns(row: dict[str, Any], ranks: Sequence[RankMeasurement]) -> None:
    """Into ``row``: the profiled step's breakdown (mean over ranks) and how far the profiled step is
    from the timed median."""
    bds = [r.breakdown for r in ranks if r.breakdown]
    for key in BREAKDOWN_KEYS:
        vals = [b[key] for b in bds if b.get(key) is not None and b[key] == b[key]]
        if vals:
            row[key] = sum(vals) / len(vals)
    median = row["step_time_median_s"]
    span = slowest_profiled_step(bds)
    if span is not None and median > 0:
        # compute + exposed comm + idle add up to each rank's profiled step by construction; how far
        # the slowest rank's is from the timed median says how much the profiler moved the step.
        row["breakdown_gap"] = span / median - 1


def placement_columns(ranks: Sequence[RankMeasurement], backend: str | None = None) -> dict[str, Any]:
    """Where the ranks ran: ``rank_placement`` (JSON, one object a rank), ``hosts`` (the nodes in
    node order as host(address)), ``cross_node`` (ranks in more than one node) and ``link`` ('N
    nodes over IFACE' when they were, the interfaces their traffic between nodes took). NCCL finds
    ranks of one host by its host name and boot id, and moves their data over NVLink, PCIe P2P or
    shared memory whatever interface its sockets use; the link says so when every node is one host."""
    by_rank = sorted(ranks, key=lambda r: r.rank)
    be = backends.find(backend) if backend else None
    placed = [{"rank": r.rank, "node": r.node_rank, "host": r.host, "addr": r.addr, "iface": r.iface,
               "local_rank": r.local_rank, "devices": list(r.device_ids), "threads": r.threads} for r in by_rank]
    nodes: dict[int, str] = {}
    for r in sorted(by_rank, key=lambda r: r.node_rank):
        nodes.setdefault(r.node_rank, f"{r.host}({r.addr})" if r.addr else r.host)
    crossed = len(nodes) > 1
    ifaces = sorted({r.iface or "?" for r in by_rank})
    return {"rank_placement": json.dumps(placed, separators=(",", ":")), "hosts": ",".join(nodes.values()),
            "cross_node": crossed, "link": (f"{len(nodes)} nodes over {'/'.join(ifaces)}" + (
                f"; one host: {be.title}'s data takes its intra-host transport" if be and be.intra_host_transport
                and len({r.host for r in by_rank}) == 1 else "")) if crossed else None}


#: A sharded rank may hold up to this multiple of 1/n of the parameters (FSDP pads each tensor's
#: first dimension to a multiple of n); a split one must hold less than this share of the model.
SHARD_SLACK, SPLIT_MAX = 1.25, 0.95


def distribution_check(spec: CellSpec, ranks: Sequence[RankMeasurement], expects: Sequence[str]) -> str | None:
    """None if a multi-device cell shows every kind of evidence its strategy declares, else why not.

    comm: communication bytes (or, where the trace has no byte count, calls) every step; sharded:
    the fullest rank holds at most ~1/n of the parameters; split: no rank holds the whole model;
    devices: every planned GPU of a one-process cell holds memory."""
    if spec.n_devices < 2:
        return None
    n, total = spec.n_devices, spec.workload.params
    numels = [r.param_numel for r in ranks]
    for kind in expects:
        if kind == "comm":
            calls = [r.comm_calls_per_step for r in ranks]
            if any(c is None for c in calls):
                return "did not distribute: no communication evidence was recorded"
            if sum(calls) == 0:  # bytes can be unknown (no shapes in the trace); calls cannot
                return f"did not distribute: no communication in a step on {n} devices (0 calls)"
        elif kind in ("sharded", "split"):
            if total is None or any(x is None for x in numels):
                return f"did not distribute: cannot tell how the parameters are {kind} (no parameter count)"
            share = max(numels) / total
            limit = SHARD_SLACK / n if kind == "sharded" else SPLIT_MAX
            if share > limit:
                return (f"did not distribute: the fullest rank holds {share:.0%} of the parameters; "
                        f"{kind} over {n} devices should be <= {limit:.0%}")
        elif kind == "devices":
            used = sum(r.devices_used or 0 for r in ranks)
            if used < n:
                return f"did not distribute: {used} of {n} planned GPUs held memory"
        else:
            raise ValueError(f"unknown evidence kind {kind!r}; use comm, sharded, split or devices")
    return None


def _first_bad(ranks: Sequence[RankMeasurement], rank: int) -> int:
    losses = next(r.losses for r in ranks if r.rank == rank)
    return next(i for i, x in enumerate(losses) if not math.isfinite(x))


def _strategy_columns(spec: CellSpec, ranks: Sequence[RankMeasurement], declared: Sequence[Metric],
                      row: dict[str, Any]) -> dict[str, Any]:
    by_name = {m.name: m for m in declared}
    out: dict[str, Any] = {}
    undeclared: dict[str, Any] = {}
    keys = dict.fromkeys(k for r in ranks for k in r.metrics)
    for k in keys:
        if k in by_name:
            out[k] = combine([r.metrics.get(k) for r in ranks], by_name[k].over_ranks)
        else:
            undeclared[f"{spec.strategy}.{k}"] = combine([r.metrics.get(k) for r in ranks], "max")
    for m in declared:
        if m.derive is not None:
            out[m.name] = m.derive({**row, **out})
    if undeclared:
        out["extras"] = json.dumps(undeclared, default=str, sort_keys=True)
    return out


def step_rows(spec: CellSpec, ranks: Sequence[RankMeasurement], *, repeat: int = 0) -> list[dict[str, Any]]:
    """One row per rank and step of one repeat (warm-up steps have no time)."""
    out = []
    for r in ranks:
        n_warm = r.warmup_steps if r.warmup_steps or not r.times else len(r.losses) - len(r.times)
        for s, loss in enumerate(r.losses):
            i = s - n_warm
            out.append({"cell_id": spec.cell_id, "repeat": repeat, "rank": r.rank, "step": s,
                        "phase": "warmup" if i < 0 else "timed",
                        "step_time_s": r.times[i] if i >= 0 else None,
                        "t_unix": r.starts[i] if 0 <= i < len(r.starts) else None,
                        "loss": loss if r.loss_weight else None, "loss_weight": r.loss_weight})
    return out
