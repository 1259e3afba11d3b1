"""Projected step time of DDP, FSDP and tensor parallel at more GPUs, from cells measured at 1 and
2 GPUs and the alpha-beta communication model; checked against measured cells where they exist.

For a strategy s, with the global batch fixed (as the measured cells have it):

* compute(N) = a + b/N through the 1-GPU cell's and s's 2-GPU cell's ``compute_time_s``: ``b`` is
  the work that divides over ranks, ``a`` what every rank repeats (optimizer, launches);
* communication per step: s's 2-GPU calls from ``comm.parquet`` (op and nccl-tests size S per
  rank and step). S does not change with N for these strategies (DDP reduces all gradients, FSDP
  gathers all parameters and reduce-scatters all gradients, TP reduces whole activations); the
  model gives each call's time at N (measured world sizes directly, others through the op's busbw
  factor, capped at the inter-node bandwidth past one node);
* overlap: the 2-GPU cell's ``overlap_frac`` hides that share of communication at every N;
* anchor: what the 2-GPU step has beyond compute and exposed comm (launch gaps, profiler skew) is
  carried unchanged, so step(2) is reproduced exactly.

Two communication variants: ``model`` (calls run at the sweep's curve) and ``calibrated`` (calls
keep the fraction of the curve the 2-GPU cell achieved). :func:`fixed_variant` picks one per
strategy family from the 2-GPU cell's recorded calls alone; its output, ``pred_step_fixed_s``, is
the one prediction checked against measured cells (``err_fixed``). The other variant's column is
kept for the figure and is not checked. Every projected row has ``kind == 'projected'``; measured
numbers only appear in ``measured_step_s`` of the check rows.

:func:`check_with_repeats` reports the check with its spread: the fixed prediction's error against
each repeat of the measured cell, and the repeats of the 1- and 2-GPU inputs.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from bench.comm.model import CommModel, annotate_comm, fit, normalize_op, predict_comm, sweep_size

STRATEGIES = ("ddp", "fsdp", "tensor")


def calls_per_step(comm_df: pd.DataFrame, cell_id: int, steps: int) -> pd.DataFrame:
    """(op, size_bytes, per_step): the calls one rank makes per step in a cell, by op and size."""
    c = comm_df[comm_df["cell_id"] == cell_id].copy()
    c["op_norm"] = c["op"].map(normalize_op)
    c = c[c["op_norm"].notna() & c["bytes"].notna()]
    if c.empty:
        return pd.DataFrame(columns=["op", "size_bytes", "per_step"])
    group = c["group_size"].where(c["group_size"].notna(), c["world_size"]).astype(float)
    c["size_bytes"] = [sweep_size(o, b, g) for o, b, g in zip(c["op_norm"], c["bytes"], group)]
    ranks = c["rank"].nunique()
    out = c.groupby(["op_norm", "size_bytes"]).size().rename("per_step").reset_index()
    out["per_step"] = out["per_step"] / (ranks * steps)
    return out.rename(columns={"op_norm": "op"})


def comm_per_step(calls: pd.DataFrame, model: CommModel, backend: str, world: int, **net: Any) -> float:
    """Model seconds per step of these calls at ``world`` ranks (net: predict's inter-node args)."""
    return float(sum(k * model.predict(o, backend, world, s, **net)
                     for o, s, k in zip(calls["op"], calls["size_bytes"], calls["per_step"])))


def measured_comm_per_step(comm_df: pd.DataFrame, cell_id: int, steps: int) -> float:
    """Sum of the cell's modelled call durations per rank and step (recorded, waits included)."""
    c = comm_df[comm_df["cell_id"] == cell_id]
    c = c[c["op"].map(normalize_op).notna() & c["bytes"].notna()]
    return float(c["duration_s"].sum() / max(c["rank"].nunique(), 1) / steps) if len(c) else 0.0


def fastest_comm_per_step(comm_df: pd.DataFrame, cell_id: int, steps: int) -> float:
    """Per step, the sum over the cell's modelled calls of the fastest rank's duration of each call
    (the k-th call of an op on each rank is one call). The last rank to reach a collective does not
    wait for a peer, so its duration is the transfer alone; the others' include their wait."""
    c = comm_df[comm_df["cell_id"] == cell_id].copy()
    c["op_norm"] = c["op"].map(normalize_op)
    c = c[c["op_norm"].notna() & c["bytes"].notna()]
    if c.empty:
        return 0.0
    c = c.sort_values(["rank", "start_s"], kind="stable")
    c["call_seq"] = c.groupby(["rank", "op_norm"]).cumcount()
    return float(c.groupby(["op_norm", "call_seq"])["duration_s"].min().sum() / steps)


def fixed_variant(model_s: float, fastest_s: float, recorded_s: float) -> str:
    """The communication variant of a strategy family, from its 2-GPU cell alone: ``calibrated``
    when the wire part of the recorded excess over the model is larger than the wait part, else
    ``model``. Arguments are per rank and step at 2 GPUs: the model's time of the recorded calls,
    the fastest rank's recorded time (:func:`fastest_comm_per_step`) and the mean rank's recorded
    time (:func:`measured_comm_per_step`).

    Why: both variants reproduce the 2-GPU step and differ only in how the recorded excess
    E = recorded - model carries to N GPUs. ``model`` holds E constant (it sits in the anchor);
    ``calibrated`` scales E with the model's communication time, as a bandwidth shortfall would
    scale. A recorded duration is the transfer plus, on every rank but the last to arrive, the
    wait for that late peer, so E splits into a wire part W = fastest - model (the transfer itself
    slower than the sweep's curve: contention with compute, message sizes or protocols the sweep
    does not represent; it grows with the bytes and hops) and a wait part Q = recorded - fastest
    (arrival skew between ranks, set by the compute side and launch jitter, not by the bytes). The
    rule takes the variant whose assumption holds for the larger part of E. Q >= 0 by
    construction, so ``calibrated`` needs the wire itself to be slower than the curve. It uses no
    data from more than 2 GPUs and has no threshold to fit. Without recorded calls, or where the
    model has no time for them, the variants coincide or are undefined: ``model``.
    """
    if not all(np.isfinite(x) for x in (model_s, fastest_s, recorded_s)) or model_s <= 0:
        return "model"
    wire, wait = fastest_s - model_s, recorded_s - fastest_s
    return "calibrated" if wire > wait else "model"


def _cell(cells: pd.DataFrame, strategy: str, world: int) -> pd.Series | None:
    c = cells[(cells["strategy"] == strategy) & (cells["world_size"] == world) & (cells["status"] == "ok")]
    return c.iloc[0] if len(c) else None


def _compute_fit(c1: float, c2: float) -> tuple[float, float]:
    """(a, b) of compute(N) = a + b/N through (1, c1) and (2, c2), kept non-negative."""
    b = 2.0 * (c1 - c2)
    if b <= 0:
        return c2, 0.0  # compute did not shrink from 1 to 2 GPUs: assume it stays
    a = c1 - b
    return (a, b) if a >= 0 else (0.0, c1)


def _inputs(c1: pd.Series, c2: pd.Series, comm_df: pd.DataFrame, model: CommModel, backend: str, steps: int,
            net: dict[str, Any]) -> dict[str, Any]:
    """What one strategy family's projection takes from its 1- and 2-GPU cells: the compute fit,
    the calls, the overlap, the recorded communication against the model and the fixed variant."""
    a, b = _compute_fit(float(c1["compute_time_s"]), float(c2["compute_time_s"]))
    cid = int(c2["cell_id"])
    calls = calls_per_step(comm_df, cid, steps)
    m2 = comm_per_step(calls, model, backend, 2, **net)
    meas2 = measured_comm_per_step(comm_df, cid, steps)
    fast2 = fastest_comm_per_step(comm_df, cid, steps)
    return {"a": a, "b": b, "calls": calls, "m2": m2, "meas2": meas2, "fast2": fast2,
            "ov": float(c2["overlap_frac"]) if pd.notna(c2.get("overlap_frac")) else 0.0,
            "eff": meas2 / m2 if m2 > 0 else 1.0,  # >1: the cell's calls were that much slower than the curve
            "variant": fixed_variant(m2, fast2, meas2),
            "step2": float(c2["step_time_median_s"]), "comp2": float(c2["compute_time_s"])}


@dataclass(frozen=True, kw_only=True)
class Network:
    """The machine a projection assumes beyond the measured cells: GPUs a node, the link between
    nodes, and the device the model's curve was fitted on (None: any)."""

    gpus_per_node: int = 8
    inter_node_gbs: float = 50.0
    inter_node_latency_s: float = 10e-6
    device: str | None = None


def project(cells: pd.DataFrame, comm_df: pd.DataFrame, model: CommModel, *, strategies: tuple[str, ...] = STRATEGIES,
            worlds: tuple[int, ...] = (4, 8, 16, 64), steps: int = 2, network: Network | None = None,
            backend: str = "nccl") -> pd.DataFrame:
    """One row per (strategy, world size): projected step time (both variants and the fixed one),
    its parts, the fixed variant's inputs, and the measured step time and the fixed prediction's
    relative error where ``cells`` has that world size."""
    net = asdict(network or Network())
    single = _cell(cells, "single", 1)
    if single is None:
        raise ValueError("cells has no ok 'single' cell at world size 1: the projection needs it for compute")
    rows = []
    for s in strategies:
        c2 = _cell(cells[cells["backend"].isin([backend, "none"])], s, 2)
        if c2 is None:
            continue
        f = _inputs(single, c2, comm_df, model, backend, steps, net)
        ov, m2, eff = f["ov"], f["m2"], f["eff"]
        other = f["step2"] - f["comp2"] - (1 - ov) * m2
        other_cal = f["step2"] - f["comp2"] - (1 - ov) * eff * m2
        for n in worlds:
            comp = f["a"] + f["b"] / n
            mn = comm_per_step(f["calls"], model, backend, n, **net)
            pred = comp + (1 - ov) * mn + other
            pred_cal = comp + (1 - ov) * eff * mn + other_cal
            fixed = pred_cal if f["variant"] == "calibrated" else pred
            meas = _cell(cells[cells["backend"] == backend], s, n)
            m_step = float(meas["step_time_median_s"]) if meas is not None else math.nan
            rows.append({"kind": "projected", "strategy": s, "backend": backend, "world_size": n,
                         "nodes": math.ceil(n / net["gpus_per_node"]), "compute_s": comp, "comm_model_s": mn,
                         "overlap_frac_2gpu": ov, "comm_efficiency_2gpu": 1 / eff if eff else math.nan,
                         "comm_model_2gpu_s": m2, "comm_fastest_2gpu_s": f["fast2"], "comm_recorded_2gpu_s": f["meas2"],
                         "variant_fixed": f["variant"], "pred_step_fixed_s": fixed,
                         "anchor_s": other, "pred_step_s": pred, "pred_step_calibrated_s": pred_cal,
                         "pred_step_unanchored_s": comp + (1 - ov) * mn, "measured_step_s": m_step,
                         "err_fixed": fixed / m_step - 1,
                         "measured_compute_s": float(meas["compute_time_s"]) if meas is not None else math.nan,
                         "inter_node_gbs": net["inter_node_gbs"] if n > net["gpus_per_node"] else math.nan})
    return pd.DataFrame(rows)


def check_table(proj: pd.DataFrame) -> pd.DataFrame:
    """The held-out rows (world size > 2, with a measured cell): the fixed prediction against the
    measured step, ms, error in %. World sizes 1 and 2 are the inputs: the anchor reproduces them by
    construction. The two variants' predictions follow, named ``unchecked_``: not part of the check."""
    c = proj[proj["measured_step_s"].notna() & (proj["world_size"] > 2)].copy()
    for k in ("pred_step_fixed_s", "measured_step_s", "compute_s", "measured_compute_s", "comm_model_s"):
        c[k[:-2] + "_ms"] = c[k] * 1e3
    c["err_fixed_pct"] = c["err_fixed"] * 100
    c["unchecked_pred_model_ms"] = c["pred_step_s"] * 1e3
    c["unchecked_pred_calibrated_ms"] = c["pred_step_calibrated_s"] * 1e3
    return c[["strategy", "world_size", "variant_fixed", "measured_step_ms", "pred_step_fixed_ms", "err_fixed_pct",
              "compute_ms", "measured_compute_ms", "comm_model_ms", "unchecked_pred_model_ms",
              "unchecked_pred_calibrated_ms"]]


def repeat_medians(steps: pd.DataFrame, cell_id: int) -> pd.Series:
    """The cell's median step time per repeat (indexed by repeat), over its timed steps, a step's
    time being its slowest rank's: the values the cell's ``step_time_median_s`` is the median of
    when it has 3 repeats or more (:func:`bench.stats.steps.summarize`). Empty without steps."""
    if steps is None or steps.empty or "step_time_s" not in steps:
        return pd.Series(dtype=float)
    s = steps[steps["cell_id"] == cell_id]
    if "phase" in s:
        s = s[s["phase"] == "timed"]
    s = s[np.isfinite(s["step_time_s"].astype(float))]
    rep = s["repeat"].fillna(0) if "repeat" in s else pd.Series(0, index=s.index)
    per_step = s.assign(repeat=rep).groupby(["repeat", "step"])["step_time_s"].max()
    return per_step.groupby(level="repeat").median().astype(float)


def error_spread(pred: float, medians: pd.Series) -> dict[str, float | int]:
    """``pred``'s relative error against each repeat's median: median, min and max over repeats,
    and their number (NaN errors with none)."""
    err = pred / medians.to_numpy(float) - 1 if len(medians) else np.array([])
    nan = math.nan
    return {"repeats": len(err), "err_median": float(np.median(err)) if len(err) else nan,
            "err_min": float(err.min()) if len(err) else nan, "err_max": float(err.max()) if len(err) else nan}


def _interval(steps: pd.DataFrame, cell: pd.Series | None) -> dict[str, float | int]:
    """A cell's step time and the range of its per-repeat medians, seconds, with the repeats."""
    if cell is None:
        return {"repeats": 0, "median_s": math.nan, "lo_s": math.nan, "hi_s": math.nan}
    m = repeat_medians(steps, int(cell["cell_id"]))
    return {"repeats": len(m), "median_s": float(cell["step_time_median_s"]),
            "lo_s": float(m.min()) if len(m) else math.nan, "hi_s": float(m.max()) if len(m) else math.nan}


def check_with_repeats(proj: pd.DataFrame, cells: pd.DataFrame, steps: pd.DataFrame,
                       backend: str = "nccl") -> pd.DataFrame:
    """The held-out rows of ``proj`` (world size > 2 with a measured cell), one per family and
    world size, seconds: the fixed prediction (``pred_fixed_s``, its variant) with the range it
    takes when the 2-GPU step comes from each of that cell's repeats instead of their median
    (``pred_fixed_lo_s``, ``_hi_s``: the anchor moves the prediction one to one with the 2-GPU
    step); the measured cell (median, per-repeat range, repeats) and the error against each of its
    repeats (median, min, max); the 1-GPU (``single``) and 2-GPU inputs' medians, per-repeat ranges
    and repeats; the fixed rule's inputs; the other variants' predictions as ``unchecked_``."""
    rows = []
    chk = proj[proj["measured_step_s"].notna() & (proj["world_size"] > 2)]
    for _, r in chk.iterrows():
        s, n = r["strategy"], int(r["world_size"])
        meas = _cell(cells[cells["backend"] == backend], s, n)
        c2 = _cell(cells[cells["backend"].isin([backend, "none"])], s, 2)
        x1, x2, xn = _interval(steps, _cell(cells, "single", 1)), _interval(steps, c2), _interval(steps, meas)
        pred = float(r["pred_step_fixed_s"])
        per_rep = repeat_medians(steps, int(meas["cell_id"]))
        row = {"strategy": s, "world_size": n, "variant_fixed": r["variant_fixed"], "pred_fixed_s": pred,
               "pred_fixed_lo_s": pred + x2["lo_s"] - x2["median_s"],
               "pred_fixed_hi_s": pred + x2["hi_s"] - x2["median_s"],
               "measured_s": xn["median_s"], "measured_lo_s": xn["lo_s"], "measured_hi_s": xn["hi_s"],
               **error_spread(pred, per_rep)}
        for tag, x in (("x1", x1), ("x2", x2)):
            row.update({f"{tag}_repeats": x["repeats"], f"{tag}_s": x["median_s"], f"{tag}_lo_s": x["lo_s"],
                        f"{tag}_hi_s": x["hi_s"]})
        row.update({k: r[k] for k in ("comm_model_2gpu_s", "comm_fastest_2gpu_s", "comm_recorded_2gpu_s")})
        row.update(unchecked_pred_model_s=r["pred_step_s"], unchecked_pred_calibrated_s=r["pred_step_calibrated_s"])
        rows.append(row)
    return pd.DataFrame(rows)


def plot_projection(proj: pd.DataFrame, path: str | Path, title: str = "") -> Path:
    """Two panels: left the 4-GPU check (measured and predicted side by side), right the
    projection, labelled PROJECTED; the two are never drawn on the same axes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    chk = proj[proj["measured_step_s"].notna() & (proj["world_size"] > 2)]
    x = np.arange(len(chk))
    ax1.bar(x - 0.2, chk["measured_step_s"] * 1e3, 0.4, label="measured", color="dimgray")
    ax1.bar(x + 0.2, chk["pred_step_fixed_s"] * 1e3, 0.4, label="predicted (fixed variant)", hatch="//",
            color="white", edgecolor="black")
    ax1.set_xticks(x, [f"{s}\nx{w}\n{v}" for s, w, v in zip(chk["strategy"], chk["world_size"], chk["variant_fixed"])])
    ax1.set_ylabel("step time (ms)")
    ax1.set_title("check: measured vs predicted (fixed variant)")
    ax1.legend(fontsize=8)
    for s, g in proj.groupby("strategy"):
        line, = ax2.plot(g["world_size"], g["pred_step_fixed_s"] * 1e3, "--o",
                         label=f"{s} ({g['variant_fixed'].iloc[0]} comm)")
        other = "pred_step_calibrated_s" if g["variant_fixed"].iloc[0] == "model" else "pred_step_s"
        ax2.plot(g["world_size"], g[other] * 1e3, ":", color=line.get_color(), alpha=0.5,
                 label=f"{s} (other variant, not checked)")
    ax2.set_xscale("log", base=2)
    ax2.set_yscale("log")
    ax2.set_xlabel("GPUs (past one node: capped at the inter-node bandwidth)")
    ax2.set_ylabel("step time (ms)")
    ax2.set_title("PROJECTED (model, not measured)")
    ax2.text(0.5, 0.5, "PROJECTED", transform=ax2.transAxes, fontsize=40, color="grey", alpha=0.2,
             ha="center", va="center", rotation=20)
    ax2.legend(fontsize=7)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def annotate_summary(comm_df: pd.DataFrame, sweep: pd.DataFrame, device: str | None = "cuda") -> pd.DataFrame:
    """Per (cell, op): calls, median achieved busbw, median curve busbw, median ratio, share of calls
    below half the curve and share of those a late peer explains."""

    a = annotate_comm(comm_df, sweep, device=device)
    a = a[a["ratio"].notna()]
    g = a.groupby(["cell_id", "backend", "n", "op_norm"])
    out = g.agg(calls=("ratio", "size"), busbw_gbs=("busbw_gbs", "median"), curve_gbs=("curve_busbw_gbs", "median"),
                ratio=("ratio", "median"), below=("below_curve", "mean"), wait_explains=("wait_explains", "mean"))
    return out.reset_index()


def main(argv: list[str] | None = None) -> int:
    """``python -m bench.comm.projection --sweep collectives.parquet --run RUN --out DIR``:
    fit the model, check the projection against the run's measured cells, project further,
    annotate the run's recorded calls; writes CSVs and projection.png into DIR, prints tables."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m bench.comm.projection")
    ap.add_argument("--sweep", nargs="+", required=True, help="collectives.parquet file(s)")
    ap.add_argument("--run", required=True, help="run folder with cells.parquet and comm.parquet (1, 2, 4 GPUs)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--inter-node-gbs", type=float, default=50.0, help="per-GPU inter-node bandwidth, GB/s")
    ap.add_argument("--gpus-per-node", type=int, default=8)
    ap.add_argument("--profile-steps", type=int, default=2, help="steps comm.parquet covers per cell")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    sweep = pd.concat([pd.read_parquet(p) for p in args.sweep], ignore_index=True)
    model = fit(sweep)
    model.fits.to_csv(out / "comm_model.csv", index=False)
    cells = pd.read_parquet(Path(args.run) / "cells.parquet")
    comm = pd.read_parquet(Path(args.run) / "comm.parquet")
    pd.set_option("display.width", 250)
    pd.set_option("display.max_columns", 30)
    t = model.table()
    print("alpha-beta model (largest size range per op/backend/world):")
    print(t[t["hi"] == np.inf].round(3).to_string(index=False))
    summ = annotate_summary(comm, sweep)
    summ.to_csv(out / "comm_vs_curve.csv", index=False)
    print(f"\nrecorded calls of {args.run} against the sweep's curve (ratio = achieved / curve busbw):")
    print(summ.round(3).to_string(index=False))
    pc = predict_comm(comm, model, steps=args.profile_steps, device="cuda")
    print("\nper cell, comm per rank and step: measured (sum of call durations) vs model:")
    print(pc.round(5).to_string(index=False))
    proj = project(cells, comm, model, steps=args.profile_steps,
                   network=Network(gpus_per_node=args.gpus_per_node, inter_node_gbs=args.inter_node_gbs, device="cuda"))
    proj.to_csv(out / "projection.csv", index=False)
    plot_projection(proj, out / "projection.png", title=f"{Path(args.run).name}: PROJECTED beyond the measured cells")
    print("\nfixed variant per family (from the 2-GPU cell: fixed_variant):")
    print(proj.drop_duplicates("strategy")[["strategy", "variant_fixed", "comm_model_2gpu_s", "comm_fastest_2gpu_s",
                                            "comm_recorded_2gpu_s"]].to_string(index=False))
    print("\nPROJECTED step time (ms; fixed variant):")
    print(proj.pivot_table(index="world_size", columns="strategy", values="pred_step_fixed_s").mul(1e3).round(1)
          .to_string())
    print("\nprojection check against measured cells (fixed variant; goal: within 10%):")
    print(check_table(proj).round(2).to_string(index=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
