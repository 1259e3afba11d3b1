"""Figures from the run tables. Each takes frames and ``ax=None``, draws, and returns the Axes."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402


def _ax(ax, size=(8, 4)):
    if ax is None:
        _, ax = plt.subplots(figsize=size)
    return ax


def cell_label(r) -> str:
    extra = "".join(f" {r[c]}" for c in ("mesh", "schedule") if c in r and pd.notna(r[c]) and r[c] != "")
    return f"{r['strategy']}{extra} {r['backend']} x{r['world_size']}"


def throughput_bars(cells: pd.DataFrame, workload: str, ax=None):
    """Horizontal bars: samples/s per ok cell of ``workload``, with the bootstrap CI of the median
    turned into a throughput interval, coloured by backend."""
    ax = _ax(ax, (8, max(2.5, 0.35 * len(cells) + 1)))
    d = cells[(cells["workload"] == workload) & (cells["status"] == "ok")].copy()
    d = d.sort_values(["strategy", "backend", "world_size"])
    labels = [cell_label(r) for _, r in d.iterrows()]
    tput = d["throughput_samples_s"].to_numpy(float)
    gb = d["global_batch"].to_numpy(float)
    lo = tput - gb / d["step_time_ci_high_s"].to_numpy(float)
    hi = gb / d["step_time_ci_low_s"].to_numpy(float) - tput
    colors = {"nccl": "tab:green", "gloo": "tab:blue", "none": "tab:gray"}
    y = np.arange(len(d))
    ax.barh(y, tput, xerr=np.vstack([np.clip(lo, 0, None), np.clip(hi, 0, None)]),
            color=[colors.get(b, "tab:purple") for b in d["backend"]], capsize=2)
    ax.set_yticks(y, labels)
    ax.invert_yaxis()
    ax.set_xlabel("throughput (samples/s), bars: 95% CI of the median step")
    ax.set_title(f"{workload}: throughput by strategy and backend")
    return ax


def step_time_boxes(cells: pd.DataFrame, steps: pd.DataFrame, workload: str, ax=None):
    """Box plot of per-step time (max over ranks) for each ok cell of ``workload``."""
    ax = _ax(ax, (8, max(2.5, 0.35 * len(cells) + 1)))
    d = cells[(cells["workload"] == workload) & (cells["status"] == "ok")].sort_values(
        ["strategy", "backend", "world_size"])
    timed = steps[steps["phase"] == "timed"]
    per_step = timed.groupby(["cell_id", "step"])["step_time_s"].max()
    data, labels = [], []
    for _, r in d.iterrows():
        if r["cell_id"] in per_step.index.get_level_values(0):
            data.append(per_step.loc[r["cell_id"]].to_numpy() * 1e3)
            labels.append(cell_label(r))
    if data:
        ax.boxplot(data, orientation="horizontal", tick_labels=labels, showfliers=True)
        ax.invert_yaxis()
    ax.set_xlabel("step time (ms), max over ranks")
    ax.set_title(f"{workload}: step-time distribution")
    return ax


def scaling_lines(cells: pd.DataFrame, workload: str, ax=None):
    """Throughput against world size, one line per (strategy, backend), with ideal linear scaling
    from the single-device reference."""
    ax = _ax(ax, (6, 4))
    d = cells[(cells["workload"] == workload) & (cells["status"] == "ok")]
    ref = d[d["strategy"] == "single"]["throughput_samples_s"]
    for (strat, backend), g in d[d["strategy"] != "single"].groupby(["strategy", "backend"]):
        g = g.sort_values("world_size")
        if g["world_size"].nunique() > 1:
            ax.plot(g["world_size"], g["throughput_samples_s"], marker="o", label=f"{strat} {backend}")
    if not ref.empty:
        ws = np.array(sorted(d["world_size"].unique()))
        ax.plot(ws, ws * float(ref.iloc[0]), "k--", lw=1, label="ideal (single x N)")
    ax.set_xlabel("world size")
    ax.set_ylabel("samples/s")
    ax.set_title(f"{workload}: scaling")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)
    return ax


def save(ax, path) -> None:
    fig = ax.figure
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _ok_sorted(cells: pd.DataFrame, workload: str) -> pd.DataFrame:
    d = cells[(cells["workload"] == workload) & (cells["status"] == "ok")]
    return d.sort_values(["strategy", "backend", "world_size"])


def breakdown_bars(cells: pd.DataFrame, workload: str, ax=None):
    """Per step (profiled steps, mean over ranks): compute, then communication split into the part
    hidden under compute and the exposed part. Cells without a breakdown are left out."""
    d = _ok_sorted(cells, workload)
    if "comm_time_s" not in d:
        d = d.iloc[0:0]
    d = d[d["comm_time_s"].notna()] if len(d) else d
    ax = _ax(ax, (8, max(2.5, 0.35 * len(d) + 1)))
    y = np.arange(len(d))
    comp = d["compute_time_s"].to_numpy(float) * 1e3 if len(d) else np.array([])
    exposed = d["exposed_comm_s"].to_numpy(float) * 1e3 if len(d) else np.array([])
    hidden = (d["comm_time_s"].to_numpy(float) * 1e3 - exposed) if len(d) else np.array([])
    ax.barh(y, comp, color="tab:blue", label="compute")
    ax.barh(y, hidden, color="none", edgecolor="tab:orange", hatch="//", label="comm hidden under compute")
    ax.barh(y, exposed, left=comp, color="tab:red", label="exposed comm")
    ax.set_yticks(y, [cell_label(r) for _, r in d.iterrows()])
    ax.invert_yaxis()
    ax.set_xlabel("ms per step (profiled steps, mean over ranks)")
    ax.set_title(f"{workload}: compute / communication breakdown")
    if len(d):
        ax.legend(fontsize=7, loc="lower right")
    return ax


def memory_bars(cells: pd.DataFrame, workload: str, ax=None):
    """Peak allocated memory per GPU (max over ranks), GiB."""
    d = _ok_sorted(cells, workload)
    d = d[d["peak_mem_bytes"].notna()]
    ax = _ax(ax, (8, max(2.5, 0.35 * len(d) + 1)))
    y = np.arange(len(d))
    ax.barh(y, d["peak_mem_bytes"].to_numpy(float) / 2**30, color="tab:purple")
    ax.set_yticks(y, [cell_label(r) for _, r in d.iterrows()])
    ax.invert_yaxis()
    ax.set_xlabel("peak memory per GPU (GiB, max over ranks)")
    ax.set_title(f"{workload}: memory")
    return ax


def telemetry_lines(samples: pd.DataFrame, cells: pd.DataFrame, metric: str = "gpu_util_pct", ax=None):
    """One line per device of a sampled metric over the run, timed windows of the cells shaded."""
    ax = _ax(ax, (10, 3.2))
    s = samples[samples["metric"] == metric]
    if s.empty:
        return ax
    t0 = s["t"].min()
    for dev, g in s.groupby("device"):
        ax.plot(g["t"] - t0, g["value"], lw=0.7, label=str(dev))
    if "timed_start_unix" in cells:
        for _, r in cells[cells["timed_start_unix"].notna()].iterrows():
            ax.axvspan(r["timed_start_unix"] - t0, r["timed_end_unix"] - t0, color="gray", alpha=0.12, lw=0)
    ax.set_xlabel("seconds since the first sample (shaded: timed steps of a cell)")
    ax.set_ylabel(metric)
    ax.legend(fontsize=7, ncol=4)
    return ax
