"""The one place a cell row is built: from the cell's spec, every rank's measurements and the
telemetry samples of its timed window.

The launcher calls :func:`build_row` when a cell's measurements arrive and :func:`failure_row`
when a cell could not produce them (skipped, crashed, timed out). Columns and how ranks combine
come from the metric registry (:mod:`bench.metrics`) and the strategy's declared metrics.
Parity and scaling efficiency need other cells and are computed when a run is read
(:func:`bench.results.derive`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from bench.hardware import peak_flops
from bench.metrics import Metric
from bench.spec import CellSpec, RankMeasurement
from bench.timing import summarize

#: NVML's energy counter advances in steps (about 12.6 J at a time was seen on H200s), so a short
#: window reads 0 or one step: no energy figure below this many seconds.
ENERGY_MIN_WINDOW_S = 1.0
#: sampled GPU metric -> cell column (mean over the cell's GPUs and its timed window)
TELEMETRY_MEANS = {"gpu_util_pct": "gpu_util_mean", "sm_active_pct": "sm_active_mean",
                   "tensor_active_pct": "tensor_active_mean", "power_w": "power_mean_w"}
BREAKDOWN_KEYS = ("compute_time_s", "comm_time_s", "exposed_comm_s", "overlap_frac", "idle_frac")


def base_row(spec: CellSpec) -> dict[str, Any]:
    """The planned facts every row of this cell carries, whatever happened to it."""
    m = spec.measure
    return {"cell_id": spec.cell_id, "workload": spec.workload.name, "strategy": spec.strategy,
            "backend": spec.backend, "device": spec.device, "world_size": spec.n_devices, "nproc": spec.n_procs,
            "role": spec.role, "steps": m.steps, "warmup": m.warmup, "precision": m.precision,
            "global_batch": spec.workload.global_batch, "params": spec.workload.params,
            "flops_per_sample": spec.workload.flops_per_sample, **spec.labels}


def failure_row(spec: CellSpec, *, status: str, reason: str, wall_s: float | None = None) -> dict[str, Any]:
    """A row for a cell that produced no measurements (skipped, failed, timed out)."""
    row = base_row(spec)
    row.update(status=status, reason=reason)
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
    """Means of the sampled GPU metrics over the timed window, on the GPUs the cell was planned on."""
    if spec.device != "cuda":
        return {}
    t0, t1 = window
    devices = {f"gpu{i}" for i in spec.devices}
    acc: dict[str, list[float]] = {}
    for s in samples:
        if t0 <= s["t"] <= t1 and s["device"] in devices and s["metric"] in TELEMETRY_MEANS:
            acc.setdefault(s["metric"], []).append(s["value"])
    return {TELEMETRY_MEANS[m]: sum(v) / len(v) for m, v in acc.items() if v}


def build_row(spec: CellSpec, ranks: Sequence[RankMeasurement], *, wall_s: float,
              strategy_metrics: Sequence[Metric] = (),
              samples: Iterable[dict[str, Any]] = ()) -> tuple[dict[str, Any], list[dict], list[dict]]:
    """(cell row, step rows, comm rows) of one cell.

    A failure on any rank fails the cell with the first failing rank's reason. Otherwise: the step
    time of a step is the maximum over ranks (the slowest rank sets the pace); median, p95, mean
    and a bootstrap interval of the median over the timed steps; throughput = global batch /
    median; MFU only where the GPU's peak is known; energy only over windows of at least
    ``ENERGY_MIN_WINDOW_S``; the breakdown is the mean over ranks; the strategy's declared metrics
    combine over ranks as declared, undeclared values go to ``extras`` under ``<strategy>.<key>``.
    """
    row = base_row(spec)
    failed = [r for r in ranks if r.status != "ok"]
    if failed:
        first = min(failed, key=lambda r: r.rank)
        row.update(status="failed", reason=f"rank {first.rank}: {first.reason}", cell_wall_s=wall_s)
        return row, [], []
    if any(len(r.times) != spec.measure.steps for r in ranks):
        counts = sorted({len(r.times) for r in ranks})
        row.update(status="failed", reason=f"ranks timed {counts} steps, expected {spec.measure.steps}",
                   cell_wall_s=wall_s)
        return row, [], []
    timed = np.array([r.times for r in ranks], dtype=np.float64)  # ranks x steps
    per_step = timed.max(axis=0)
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
    row.update(status="ok", reason="", **stats, throughput_samples_s=tput, mfu=mfu,
               peak_mem_bytes=max(mems) if mems else None, loss_final=final, gpu_name=gpu_name,
               cell_wall_s=wall_s, overhead_s=wall_s - float(per_step.sum()) - profile_s, profile_s=profile_s)
    nonfinite = [r.rank for r in ranks if r.loss_weight and any(not math.isfinite(x) for x in r.losses)]
    if nonfinite:
        row.update(status="failed", reason=f"rank {nonfinite[0]}: loss is NaN or infinite "
                                           f"(step {_first_bad(ranks, nonfinite[0])})")
    window = ranks[0].window
    if window is not None:
        t0, t1 = window
        row.update(timed_start_unix=t0, timed_end_unix=t1)
        energies = [r.energy_j for r in ranks]
        if spec.device == "cuda" and all(e is not None for e in energies) and t1 - t0 >= ENERGY_MIN_WINDOW_S:
            energy = float(sum(energies))
            samples_done = spec.measure.steps * spec.workload.global_batch
            row.update(energy_j=energy, energy_per_sample_j=energy / samples_done,
                       samples_per_j=samples_done / energy if energy > 0 else None)
        row.update(telemetry_means(samples, spec, window))
    bds = [r.breakdown for r in ranks if r.breakdown]
    for key in BREAKDOWN_KEYS:
        vals = [b[key] for b in bds if b.get(key) is not None and b[key] == b[key]]
        if vals:
            row[key] = sum(vals) / len(vals)
    parity = [r.self_parity for r in ranks if r.self_parity is not None]
    if parity:
        row["parity_rel_err"] = parity[0]
    row.update(_strategy_columns(spec, ranks, strategy_metrics, row))
    steps = step_rows(spec, ranks)
    comm = [{"cell_id": spec.cell_id, "rank": r.rank, "backend": spec.backend, "world_size": spec.n_devices, **c}
            for r in ranks for c in r.comm]
    return row, steps, comm


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


def step_rows(spec: CellSpec, ranks: Sequence[RankMeasurement]) -> list[dict[str, Any]]:
    """One row per rank and step (warm-up steps have no time)."""
    n_warm = spec.measure.warmup
    out = []
    for r in ranks:
        for s, loss in enumerate(r.losses):
            i = s - n_warm
            out.append({"cell_id": spec.cell_id, "rank": r.rank, "step": s, "phase": "warmup" if i < 0 else "timed",
                        "step_time_s": r.times[i] if i >= 0 else None,
                        "t_unix": r.starts[i] if 0 <= i < len(r.starts) else None,
                        "loss": loss if r.loss_weight else None, "loss_weight": r.loss_weight})
    return out
