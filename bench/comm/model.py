"""Communication model: op-name normalisation, achieved bandwidth of recorded calls against the
sweep's curve, and an alpha-beta latency-bandwidth model fitted from the sweep.

Sizes are nccl-tests sizes S (see ``bench.comm.worker``). ``comm.parquet`` records a call's input
bytes: the per-rank shard for all_gather (S = bytes x group size), the whole input for
reduce_scatter (S = bytes), the buffer for the rest.

The model: ``t(S) = alpha + S / beta`` per (op, backend, device, world size, size range), fitted by
weighted least squares on relative error (minimise sum(((alpha + S/beta) - t) / t)^2), so 1 KiB and
1 GiB points count alike. Separate size ranges because NCCL switches protocol (LL, LL128, Simple)
with size and each regime has its own latency and bandwidth.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from bench.comm.ops import GB, busbw_factor

#: every op name seen in NCCL traces (record_param_comms, kernel names) and Gloo spans -> sweep op
OP_NAMES: dict[str, str] = {
    **dict.fromkeys(["allreduce", "all_reduce", "allreduce_coalesced", "allreduce_sparse",
                     "all_reduce_coalesced"], "all_reduce"),
    **dict.fromkeys(["all_gather_into_tensor", "_allgather_base", "allgather", "all_gather",
                     "allgather_into_tensor_coalesced", "all_gather_into_tensor_coalesced",
                     "allgather_coalesced", "_allgather_into_tensor_coalesced"], "all_gather"),
    **dict.fromkeys(["reduce_scatter_tensor", "_reduce_scatter_base", "reduce_scatter", "reducescatter",
                     "reduce_scatter_tensor_coalesced", "_reduce_scatter_tensor_coalesced"], "reduce_scatter"),
    **dict.fromkeys(["broadcast", "_broadcast_oop", "broadcast_coalesced"], "broadcast"),
    **dict.fromkeys(["all_to_all", "alltoall", "all_to_all_single", "alltoall_base"], "all_to_all"),
    **dict.fromkeys(["send", "recv", "sendrecv", "isend", "irecv", "recv_anysource", "batch_isend_irecv"],
                    "sendrecv"),
}
#: ops whose recorded bytes are one rank's shard of S
SHARD_INPUT = {"all_gather"}
DEFAULT_EDGES = (64 * 2**10, 8 * 2**20)  # range edges: LL below ~64 KiB, Simple above ~8 MiB on NVLink


def normalize_op(name: object) -> str | None:
    """A recorded op name -> sweep op ('all_reduce', ...), or None if it has no sweep."""
    if name is None or (isinstance(name, float) and math.isnan(name)):
        return None
    s = str(name).strip()
    key = s.lower()
    if key in OP_NAMES:
        return OP_NAMES[key]
    # NCCL kernel names without a param-comms record: 'AllReduce_Sum_bf16_RING_LL', 'SendRecv'
    head = key.split("_")[0]
    return OP_NAMES.get(head)


def sweep_size(op: str, recorded_bytes: float, group: int) -> float:
    """comm.parquet's bytes -> the nccl-tests size S of the same call."""
    return recorded_bytes * group if op in SHARD_INPUT else recorded_bytes


def curve(sweep: pd.DataFrame, op: str, backend: str, world: int, device: str | None = None) -> pd.Series:
    """busbw (GB/s) by size of one op from the sweep's ok rows (median over dtypes), sorted."""
    s = sweep[(sweep["op"] == op) & (sweep["backend"] == backend) & (sweep["world_size"] == world)]
    if "kind" in s:
        s = s[s["kind"] == "sweep"]
    if "status" in s:
        s = s[s["status"] == "ok"]
    if device is not None and "device" in s:
        s = s[s["device"] == device]
    return s.groupby("bytes")["busbw_gbs"].median().sort_index()


def interp_log(c: pd.Series, size: float) -> float:
    """The curve at ``size``, linear in log(size), held flat beyond its ends."""
    if c.empty or not size or size <= 0 or not np.isfinite(size):
        return float("nan")
    return float(np.interp(math.log(size), np.log(c.index.to_numpy(float)), c.to_numpy(float)))


def annotate_comm(comm_df: pd.DataFrame, sweep_df: pd.DataFrame, *, device: str | None = None,
                  threshold: float = 0.5) -> pd.DataFrame:
    """Each recorded call with its achieved algbw/busbw, the sweep's busbw at its size (same op,
    backend, group size) and their ratio; ``below_curve`` where ratio < ``threshold``.

    ``peer_best_ratio`` is the ratio with the fastest rank's duration of the same call (calls
    matched by cell, op and order on each rank); ``wait_explains`` marks slow calls where that
    fastest rank is on the curve: the slow rank's kernel mostly waited for a late peer, since a
    recorded duration includes that wait.
    """
    df = comm_df.copy()
    df["op_norm"] = df["op"].map(normalize_op)
    group = df["group_size"].where(df["group_size"].notna(), df["world_size"]).astype(float)
    df["n"] = group.astype("Int64")
    df["size_bytes"] = [sweep_size(o, b, g) if o else float("nan")
                        for o, b, g in zip(df["op_norm"], df["bytes"], group)]
    df["algbw_gbs"] = df["size_bytes"] / df["duration_s"] / GB
    df["busbw_gbs"] = [a * busbw_factor(o, int(g)) if o else float("nan")
                       for a, o, g in zip(df["algbw_gbs"], df["op_norm"], group)]
    curves: dict[tuple, pd.Series] = {}
    ref = []
    for o, be, g, s in zip(df["op_norm"], df["backend"], group, df["size_bytes"]):
        if not o or not np.isfinite(s):
            ref.append(float("nan"))
            continue
        key = (o, be, int(g))
        if key not in curves:
            curves[key] = curve(sweep_df, o, be, int(g), device)
        ref.append(interp_log(curves[key], s))
    df["curve_busbw_gbs"] = ref
    df["ratio"] = df["busbw_gbs"] / df["curve_busbw_gbs"]
    df["below_curve"] = df["ratio"] < threshold
    # same call on every rank: k-th call of this op on each rank of a cell
    df = df.sort_values(["cell_id", "rank", "start_s"], kind="stable")
    df["call_seq"] = df.groupby(["cell_id", "rank", "op_norm"], dropna=False).cumcount()
    fastest = df.groupby(["cell_id", "op_norm", "call_seq"], dropna=False)["duration_s"].transform("min")
    df["peer_best_ratio"] = df["ratio"] * df["duration_s"] / fastest
    df["wait_explains"] = df["below_curve"] & (df["peer_best_ratio"] >= threshold)
    return df.sort_index()


@dataclass
class CommModel:
    """Fitted alpha-beta segments: one row per (op, backend, device, world_size, lo, hi) with
    ``alpha_s``, ``beta_bps`` (algorithm bandwidth, bytes/s), ``busbw_gbs``, ``rel_rms``, ``rel_max``
    and ``points``."""

    fits: pd.DataFrame

    def segments(self, op: str, backend: str, device: str | None = None) -> pd.DataFrame:
        f = self.fits[(self.fits["op"] == op) & (self.fits["backend"] == backend)]
        return f[f["device"] == device] if device is not None else f

    def predict(self, op: str, backend: str, world: int, nbytes: float, *, device: str | None = None,
                gpus_per_node: int | None = None, inter_node_gbs: float | None = None,
                inter_node_latency_s: float = 10e-6) -> float:
        """Seconds for one call of nccl-tests size ``nbytes`` at ``world`` ranks.

        A world size the sweep did not measure uses the nearest measured one below (else above):
        its bus bandwidth is kept and converted with the op's busbw factor at ``world``, and alpha
        grows with the number of hops, (n-1)/(n0-1). Past ``gpus_per_node`` ranks the bus bandwidth
        is capped at ``inter_node_gbs`` (per GPU, GB/s) and ``inter_node_latency_s`` is added.
        """
        seg = self.segments(op, backend, device)
        if seg.empty or not nbytes or not np.isfinite(nbytes):
            return float("nan")
        worlds = sorted(set(int(w) for w in seg["world_size"]))
        below = [w for w in worlds if w <= world]
        w0 = below[-1] if below else worlds[0]
        seg = seg[seg["world_size"] == w0]
        inside = seg[(seg["lo"] <= nbytes) & (nbytes < seg["hi"])]
        row = (inside if len(inside) else seg.iloc[[int(np.argmin(np.abs(np.log(seg["lo"].clip(lower=1))
                                                                        - math.log(nbytes))))]]).iloc[0]
        alpha, busbw = float(row["alpha_s"]), float(row["busbw_gbs"]) * GB
        if world != w0 and op not in ("broadcast", "sendrecv"):
            alpha *= (world - 1) / max(w0 - 1, 1)
        if gpus_per_node and inter_node_gbs and world > gpus_per_node:
            busbw = min(busbw, inter_node_gbs * GB)
            alpha += inter_node_latency_s
        return alpha + nbytes * busbw_factor(op, world) / busbw

    def table(self) -> pd.DataFrame:
        """The fits, for printing: alpha in us, busbw in GB/s, errors in %."""
        t = self.fits.copy()
        t["alpha_us"] = t["alpha_s"] * 1e6
        t["rel_rms_pct"] = t["rel_rms"] * 100
        return t[["op", "backend", "device", "world_size", "lo", "hi", "alpha_us", "busbw_gbs", "rel_rms_pct",
                  "points"]]


def fit_alpha_beta(sizes: np.ndarray, times: np.ndarray) -> tuple[float, float, float, float]:
    """(alpha_s, beta_bytes_per_s, rel_rms, rel_max) minimising the relative error of
    ``alpha + S/beta`` against ``times``; alpha >= 0 and beta > 0 (refit with the other fixed
    where the free fit crosses zero)."""
    s, t = np.asarray(sizes, float), np.asarray(times, float)
    a = np.column_stack([1.0 / t, s / t])  # (alpha + S*g)/t ~ 1, g = 1/beta
    (alpha, g), *_ = np.linalg.lstsq(a, np.ones_like(t), rcond=None)
    if g <= 0:  # flat: latency only
        alpha, g = float(np.sum(1 / t) / np.sum(1 / t**2)), 0.0
    elif alpha < 0:  # through the origin: bandwidth only
        alpha, g = 0.0, float(np.sum(s / t) / np.sum((s / t) ** 2))
    rel = (alpha + s * g - t) / t
    beta = 1.0 / g if g > 0 else float("inf")
    return float(alpha), beta, float(np.sqrt(np.mean(rel**2))), float(np.max(np.abs(rel)))


def fit(sweep_df: pd.DataFrame, edges: tuple[float, ...] = DEFAULT_EDGES) -> CommModel:
    """Fit every (op, backend, device, world size, size range) of the sweep's ok rows (times are
    pooled over dtypes: NCCL moves bytes, not elements). Ranges with fewer than 2 sizes merge into
    their neighbour."""
    s = sweep_df
    if "kind" in s:
        s = s[s["kind"] == "sweep"]
    if "status" in s:
        s = s[s["status"] == "ok"]
    if "device" not in s:
        s = s.assign(device="cuda")
    rows = []
    for (op, be, dev, w), g in s.groupby(["op", "backend", "device", "world_size"]):
        bounds = [0.0, *edges, math.inf]
        spans = [(lo, hi) for lo, hi in zip(bounds[:-1], bounds[1:])
                 if g[(g["bytes"] >= lo) & (g["bytes"] < hi)]["bytes"].nunique() >= 2]
        if not spans:
            spans = [(0.0, math.inf)] if g["bytes"].nunique() >= 2 else []
        # widen so the spans cover everything: a lone size joins its neighbour's range
        spans = [(0.0 if i == 0 else lo, math.inf if i == len(spans) - 1 else spans[i + 1][0])
                 for i, (lo, hi) in enumerate(spans)]
        for lo, hi in spans:
            part = g[(g["bytes"] >= lo) & (g["bytes"] < hi)]
            alpha, beta, rms, mx = fit_alpha_beta(part["bytes"].to_numpy(), part["time_s"].to_numpy())
            rows.append({"op": op, "backend": be, "device": dev, "world_size": int(w), "lo": lo, "hi": hi,
                         "alpha_s": alpha, "beta_bps": beta, "busbw_gbs": beta * busbw_factor(op, int(w)) / GB,
                         "rel_rms": rms, "rel_max": mx, "points": len(part)})
    return CommModel(pd.DataFrame(rows))


def predict_comm(comm_df: pd.DataFrame, model: CommModel, *, steps: int = 1,
                 device: str | None = None) -> pd.DataFrame:
    """Per training cell: the communication the model predicts for its recorded calls next to the
    measured (sum of call durations), both per rank and per step (``steps`` = profiled steps).
    Calls with no size or no sweep op (kernels without a param-comms record) are counted apart."""
    df = comm_df.copy()
    df["op_norm"] = df["op"].map(normalize_op)
    group = df["group_size"].where(df["group_size"].notna(), df["world_size"]).astype(float)
    df["size_bytes"] = [sweep_size(o, b, g) if o else float("nan")
                        for o, b, g in zip(df["op_norm"], df["bytes"], group)]
    df["pred_s"] = [model.predict(o, be, int(g), s, device=device) if o else float("nan")
                    for o, be, g, s in zip(df["op_norm"], df["backend"], group, df["size_bytes"])]
    modelled = df["pred_s"].notna()
    per = steps * df.groupby("cell_id")["rank"].transform("nunique")
    df["meas_w"] = df["duration_s"] / per
    df["pred_w"] = df["pred_s"] / per
    out = df.groupby("cell_id").agg(backend=("backend", "first"), world_size=("world_size", "first"),
                                    calls=("op", "size"), ranks=("rank", "nunique"))
    out["measured_s"] = df[modelled].groupby("cell_id")["meas_w"].sum()
    out["predicted_s"] = df[modelled].groupby("cell_id")["pred_w"].sum()
    out["unmodelled_calls"] = (~modelled).groupby(df["cell_id"]).sum()
    out["unmodelled_s"] = df[~modelled].groupby("cell_id")["meas_w"].sum()
    out[["measured_s", "predicted_s", "unmodelled_s"]] = out[["measured_s", "predicted_s", "unmodelled_s"]].fillna(0.0)
    out["measured_over_predicted"] = out["measured_s"] / out["predicted_s"].where(out["predicted_s"] > 0)
    return out.reset_index()


def fingerprint(meta: dict) -> tuple:
    """What must match for a stored sweep to stand for a run's machine: GPU models and count,
    driver, torch and NCCL versions (a sweep from another box or stack is another curve)."""
    return (tuple(meta.get("gpus") or ()), meta.get("gpu_count"), meta.get("driver"), meta.get("torch"),
            meta.get("nccl"))


def find_sweep(results_root: str | Path, meta: dict) -> Path | None:
    """The newest ``collectives.parquet`` under ``results_root`` whose run has ``meta``'s
    fingerprint, or None. Run ids sort by time, so the last match is the newest."""
    import json

    want = fingerprint(meta)
    found = None
    for p in sorted(Path(results_root).glob("*/collectives.parquet")):
        m = p.parent / "meta.json"
        if m.is_file() and fingerprint(json.loads(m.read_text())) == want:
            found = p
    return found
