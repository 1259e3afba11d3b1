"""Figures from the run tables. Each takes frames and ``ax=None`` (or a figure size), draws, and
returns the Axes; sizes follow the content (bars x rows), units are on every axis, backends have a
legend. ``MAX_BARS`` keeps a huge run's figures readable: the rest is in the table.
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

from bench.core.backends import find as find_backend  # noqa: E402
from bench.core.metrics import BREAKDOWN_GAP_MAX  # noqa: E402
from bench.core.text import gap_text  # noqa: E402
from bench.decide.fits import PARTS, footprint  # noqa: E402
from bench.decide.rules import is_reference, rebuild_off  # noqa: E402
from bench.stats.steps import EFFICIENCY_MAX  # noqa: E402

MAX_BARS = 40
BAR_IN, BASE_IN, WIDTH_IN = 0.24, 1.3, 8.0


def _color(backend: str) -> str:
    """The backend's colour from the registry; grey for a row of no registered backend."""
    b = find_backend(backend)
    return b.color if b else "tab:gray"


def _ax(ax, size):
    if ax is None:
        _, ax = plt.subplots(figsize=size)
    return ax


def cell_label(r) -> str:
    """'dp-pp 2x2 gloo x4': the strategy, its mesh or schedule where the name does not already say
    it ('pipeline-1f1b', not 'pipeline-1f1b 1f1b'), the backend and the world size."""
    words = set(str(r["strategy"]).split("-"))
    extra = "".join(f" {r[c]}" for c in ("mesh", "schedule") if c in r and pd.notna(r[c]) and r[c] != ""
                    and not words & set(str(r[c]).split("-")))
    return f"{r['strategy']}{extra} {r['backend']} x{r['world_size']}"


def _ok(cells: pd.DataFrame, workload: str) -> pd.DataFrame:
    return cells[(cells["workload"] == workload) & (cells["status"] == "ok")]


def _backend_legend(ax, backends) -> None:
    handles = [Patch(color=_color(b), label=b) for b in sorted(set(backends))]
    if handles:
        ax.legend(handles=handles, title="backend", fontsize=7, title_fontsize=7, loc="lower right")


def throughput_bars(cells: pd.DataFrame, workload: str, ax=None):
    """Throughput of each ok cell, fastest first within each world size (world sizes top to
    bottom), the 95% interval of the median as error bars, coloured by backend."""
    d = _ok(cells, workload).sort_values(["world_size", "throughput_samples_s"], ascending=[True, False])
    d = d.groupby("world_size", group_keys=False).head(MAX_BARS // max(d["world_size"].nunique(), 1) or 1)
    ax = _ax(ax, (WIDTH_IN, BASE_IN + BAR_IN * len(d)))
    tput = d["throughput_samples_s"].to_numpy(float)
    gb = d["global_batch"].to_numpy(float)
    lo = tput - gb / d["step_time_ci_high_s"].to_numpy(float)
    hi = gb / d["step_time_ci_low_s"].to_numpy(float) - tput
    y = np.arange(len(d))
    ax.barh(y, tput, xerr=np.nan_to_num(np.vstack([np.clip(lo, 0, None), np.clip(hi, 0, None)])),
            color=[_color(b) for b in d["backend"]], capsize=2)
    ax.set_yticks(y, [cell_label(r) for _, r in d.iterrows()], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("throughput (samples/s); error bars: 95% interval of the median step")
    ax.set_title(f"{workload}: throughput, fastest first per world size", fontsize=9)
    _backend_legend(ax, d["backend"])
    return ax


def scaling_lines(cells: pd.DataFrame, workload: str, ax=None):
    """Scaling efficiency against world size per (strategy, backend), strong and weak scaling
    drawn apart; 1.0 is ideal. World sizes are the integer ticks that were run."""
    ax = _ax(ax, (WIDTH_IN, 3.6))
    d = _ok(cells, workload)
    d = d[d["scaling_efficiency"].notna() & ~is_reference(d)]
    if "scaling" not in d:
        d = d.assign(scaling="strong")
    for (strat, backend, mode), g in d.groupby(["strategy", "backend", d["scaling"].fillna("strong")]):
        # A strategy run at one world size is a point (a line needs two); drawing only lines left the
        # figure of a one-world-size run empty.
        g = g.sort_values("world_size")
        label = f"{strat} {backend}" + (" (weak)" if mode == "weak" else "")
        ax.plot(g["world_size"], g["scaling_efficiency"], marker="o", lw=1, ls="-" if mode != "weak" else ":",
                label=label)
    sizes = sorted(int(x) for x in _ok(cells, workload)["world_size"].unique())
    ax.set_xticks(sizes)
    ax.axhline(1.0, color="k", ls="--", lw=0.8, label="ideal")
    # Above EFFICIENCY_MAX an efficiency is not physical (noise, a slow reference, another precision):
    # the axis stops just past it, the band above is shaded, and such points sit on its edge, named.
    top = EFFICIENCY_MAX + 0.25
    over = d[d["scaling_efficiency"] > top]
    if (d["scaling_efficiency"] > EFFICIENCY_MAX).any():
        ax.axhspan(EFFICIENCY_MAX, top, color="#f4c7c3", alpha=0.5, lw=0, label=f"> {EFFICIENCY_MAX}: not physical")
    if len(over):
        ax.set_ylim(top=top)
        ax.scatter(over["world_size"], [top] * len(over), marker="^", color="#b00", zorder=3, clip_on=False,
                   label=f"off the axis (up to {over['scaling_efficiency'].max():.1f})")
    ax.set_ylim(bottom=0)
    ax.set_xlabel("world size (devices)")
    ax.set_ylabel("scaling efficiency (1 = ideal)")
    ax.set_title(f"{workload}: scaling against one device", fontsize=9)
    if ax.get_legend_handles_labels()[0]:  # beside the lines, never over them
        ax.legend(fontsize=6, ncol=1 + len(ax.get_legend_handles_labels()[0]) // 14, loc="upper left",
                  bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    return ax


def pareto(cells: pd.DataFrame, workload: str, ax=None):
    """Throughput against peak memory per device; the Pareto front (no other cell is both faster
    and smaller) is joined, its points numbered and the numbers named beside the plot (labels
    written at the points overlapped wherever two front cells were close)."""
    from matplotlib.lines import Line2D

    d = _ok(cells, workload)
    d = d[d["peak_mem_bytes"].notna()]
    ax = _ax(ax, (WIDTH_IN, 4.0))
    if d.empty:
        return ax
    mem, tput = d["peak_mem_bytes"].to_numpy(float) / 2**30, d["throughput_samples_s"].to_numpy(float)
    ax.scatter(mem, tput, c=[_color(b) for b in d["backend"]], s=18)
    order = np.argsort(mem)
    front, best = [], -np.inf
    for i in order:
        if tput[i] > best:
            front.append(i)
            best = tput[i]
    ax.plot(mem[front], tput[front], "k-", lw=0.8)
    for k, i in enumerate(front, 1):
        ax.annotate(str(k), (mem[i], tput[i]), fontsize=7, xytext=(3, 3), textcoords="offset points")
    ax.set_xlabel("peak memory per device (GiB)")
    ax.set_ylabel("throughput (samples/s)")
    ax.set_title(f"{workload}: throughput against memory", fontsize=9)
    handles = [Patch(color=_color(b), label=b) for b in sorted(set(d["backend"]))]
    handles.append(Line2D([], [], color="k", lw=0.8, label="Pareto front:"))
    # The numbered markers are mathtext ("$1$"), whatever the caller's text.parse_math; the labels,
    # names from the run, are drawn as plain text.
    with plt.rc_context({"text.parse_math": True}):
        handles += [Line2D([], [], ls="", marker=f"${k}$", color="k", label=cell_label(d.iloc[i]))
                    for k, i in enumerate(front, 1)]
        legend = ax.legend(handles=handles, fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0),
                           borderaxespad=0)
    for text in legend.get_texts():
        text.set_parse_math(False)
    return ax


def off_label(r: pd.Series, gap: float) -> str:
    """The warning of a breakdown bar whose profiled step is ``gap`` off the timed one."""
    moved = rebuild_off(r)
    return f" (! profiled step {gap_text(gap)} off the timed one" + (
        f"; its build {gap_text(moved)} off unprofiled)" if moved is not None else ")")


def breakdown_bars(cells: pd.DataFrame, workload: str, ax=None):
    """The measured step split into compute, exposed communication, pipeline bubble or idle, and
    other (stacked: they sum to the timed median), hidden communication beside it (hatched).
    The split is the profiled steps' proportions applied to the timed median; a cell whose profiled
    step differs from the timed one by more than BREAKDOWN_GAP_MAX says so in its label (its
    proportions describe another step, and the recommendation does not use them), and so does
    one whose profile pass's build ran that far off before any profiling."""
    d = _ok(cells, workload)
    if "compute_time_s" not in d:
        d = d.iloc[0:0]
    d = d[d["compute_time_s"].notna()].copy()
    # Runs written before profiled_step_s: the profiled step from its parts (busy / (1 - idle)).
    span = (d["compute_time_s"] + d["exposed_comm_s"]) / (1 - d["idle_frac"].clip(upper=0.99))
    d["profiled_step_s"] = d["profiled_step_s"].fillna(span) if "profiled_step_s" in d else span
    mean_gap = d["profiled_step_s"] / d["step_time_median_s"] - 1  # runs written before breakdown_gap
    d["breakdown_gap"] = d["breakdown_gap"].fillna(mean_gap) if "breakdown_gap" in d else mean_gap
    d = d.sort_values("step_time_median_s").head(MAX_BARS)
    ax = _ax(ax, (WIDTH_IN, BASE_IN + BAR_IN * 1.6 * len(d)))
    if d.empty:
        return ax
    prof = d["profiled_step_s"].to_numpy(float)
    step = d["step_time_median_s"].to_numpy(float) * 1e3
    comp, exposed = d["compute_time_s"].to_numpy(float), d["exposed_comm_s"].to_numpy(float)
    idle = np.clip(prof - comp - exposed, 0, None)
    scale = step / prof
    parts = {"compute": comp * scale, "exposed comm": exposed * scale, "idle / bubble": idle * scale}
    parts["other"] = np.clip(step - sum(parts.values()), 0, None)
    colors = {"compute": "tab:blue", "exposed comm": "tab:red", "idle / bubble": "tab:gray", "other": "tab:olive"}
    y = np.arange(len(d)) * 1.6
    left = np.zeros(len(d))
    for name, v in parts.items():
        ax.barh(y, v, left=left, color=colors[name], label=name, height=0.9)
        left += v
    hidden = (d["comm_time_s"].to_numpy(float) - exposed) * scale
    ax.barh(y + 0.75, hidden, height=0.45, color="none", edgecolor="tab:orange", hatch="////",
            label="comm hidden under compute")
    gaps = d["breakdown_gap"].to_numpy(float)
    labels = [cell_label(r) + (off_label(r, g) if abs(g) > BREAKDOWN_GAP_MAX else "")
              for (_, r), g in zip(d.iterrows(), gaps)]
    ax.set_yticks(y, labels, fontsize=7)
    ax.invert_yaxis()
    # Each stacked segment is sticky at its left end, so autoscaling leaves no room after the longest
    # bar (it looked cut off at the frame): leave 4%.
    ax.set_xlim(0, max(float(np.nanmax(left)), float(np.nanmax(hidden, initial=0))) * 1.04 or 1)
    ax.set_xlabel("ms per step (stacked parts sum to the timed median)")
    ax.set_title(f"{workload}: where the step goes", fontsize=9)
    # Inside, top right: the fastest (shortest) bars are at the top. A legend above the Axes, centred
    # on it, ran past the figure's right edge when the cell labels are long and pushed the Axes off it.
    ax.legend(fontsize=6, loc="upper right", ncol=1)
    return ax


def energy_bars(cells: pd.DataFrame, workload: str, ax=None):
    """Energy per training sample (J), lowest first; cells whose timed window was under 1 s have
    no figure (NVML's counter moves in ~12 J steps) and are left out."""
    d = _ok(cells, workload)
    d = d[d["energy_per_sample_j"].notna()].sort_values("energy_per_sample_j").head(MAX_BARS) \
        if "energy_per_sample_j" in d else d.iloc[0:0]
    ax = _ax(ax, (WIDTH_IN, BASE_IN + BAR_IN * len(d)))
    y = np.arange(len(d))
    ax.barh(y, d["energy_per_sample_j"].to_numpy(float) if len(d) else [],
            color=[_color(b) for b in d["backend"]])
    ax.set_yticks(y, [cell_label(r) for _, r in d.iterrows()], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("energy per sample (J), all GPUs of the cell")
    ax.set_title(f"{workload}: energy", fontsize=9)
    return ax


MEMORY_COLORS = {"params": "tab:blue", "optimizer": "tab:purple", "grads": "tab:orange", "activations": "tab:green",
                 "buffers": "tab:brown", "data": "tab:gray", "other": "tab:olive"}
HELD = (("params", "held_params_bytes"), ("grads", "held_grads_bytes"), ("optimizer", "held_optimizer_bytes"))
#: the measured figures drawn on a memory bar: column, marker, colour, legend label
MEASURED = (("peak_mem_bytes", "D", "k", "measured allocated peak"),
            ("peak_reserved_bytes", "|", "tab:red", "measured reserved peak"),
            ("nvml_process_bytes", "x", "tab:red", "NVML process memory"))


def memory_cells(cells: pd.DataFrame, workload: str) -> pd.DataFrame:
    """The ok cells of ``workload`` that carry a prediction (runs without the memory model have none)."""
    d = _ok(cells, workload)
    return d[d["mem_pred_bytes"].notna()] if "mem_pred_bytes" in d else d.iloc[0:0]


def memory_error_label(r: pd.Series) -> str:
    """The error beside a memory bar: predicted / measured allocated peak - 1, else (CPU) the counted
    parameters, gradients and state against their prediction; '(lower bound)' for a prediction without
    its activations."""
    err = r.get("mem_pred_error")
    if pd.notna(err):
        out = f"pred {err:+.0%}"
    else:
        held = [r.get(c) for _, c in HELD]
        pred = sum(float(r.get(f"mem_pred_{k}_bytes") or 0) for k, _ in HELD)
        out = f"held {sum(held) / pred - 1:+.0%} of pred" if all(pd.notna(h) for h in held) and pred else ""
    return out + (" (lower bound)" if str(r.get("mem_pred_how") or "").startswith("lower bound") else "")


def memory_bars(cells: pd.DataFrame, workload: str, ax=None):
    """Per ok cell, the memory model's predicted peak of its fullest device stacked by component (the
    gradients at the optimizer step's peak, the activations at backward's), markers for what was
    measured (allocated and reserved peak, NVML's process memory: CUDA only), the bytes of parameters,
    gradients and state counted on the rank as a thin hatched bar beneath (what a CPU run has), the
    capacity a rank has as a dashed line, and the error as a label."""
    d = memory_cells(cells, workload).sort_values(["world_size", "strategy"]).head(MAX_BARS)
    ax = _ax(ax, (WIDTH_IN, BASE_IN + 0.34 * len(d)))
    if d.empty:
        return ax
    top = max(float(np.nanmax(d[[c for c in ("mem_pred_bytes", *(m[0] for m in MEASURED)) if c in d]]
                              .to_numpy(float))), 1.0)
    unit, scale = ("GiB", 2**30) if top >= 2**30 else ("MiB", 2**20)
    y = np.arange(len(d))
    left = np.zeros(len(d))
    held = False
    fps = [footprint(r) for _, r in d.iterrows()]
    for part in PARTS:
        v = np.array([fp.parts()[part] for fp in fps]) / scale
        if v.any():
            ax.barh(y, v, left=left, height=0.55, color=MEMORY_COLORS[part], label=f"predicted {part}")
        left += v
    if all(c in d for _, c in HELD) and d[[c for _, c in HELD]].notna().all(axis=1).any():
        hl = np.zeros(len(d))
        for part, col in HELD:
            v = d[col].to_numpy(float) / scale
            ax.barh(y + 0.4, np.nan_to_num(v), left=hl, height=0.22, color="none", edgecolor=MEMORY_COLORS[part],
                    hatch="////", lw=0.6)
            hl += np.nan_to_num(v)
        held = True
    for col, mark, color, label in MEASURED:
        if col in d and d[col].notna().any():
            ax.scatter(d[col].to_numpy(float) / scale, y, marker=mark, color=color, s=30, zorder=3, label=label)
    far = _capacity(ax, d, y, scale, top)
    for k, (_, r) in enumerate(d.iterrows()):
        ax.annotate(memory_error_label(r), (left[k], y[k]), xytext=(4, 0), textcoords="offset points", fontsize=6,
                    va="center")
    ax.set_yticks(y, [cell_label(r) for _, r in d.iterrows()], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlim(0, ax.get_xlim()[1] * 1.12)  # room for the labels
    ax.set_xlabel(f"{unit} on the cell's fullest device" + (f" (a rank's capacity, {far}, is off the axis)"
                                                             if far else ""))
    ax.set_title(f"{workload}: predicted memory by component against what was measured", fontsize=9)
    handles, _ = ax.get_legend_handles_labels()
    if held:
        handles.append(Patch(facecolor="none", edgecolor="k", hatch="////",
                             label="counted on the rank (params, grads, state)"))
    ax.legend(handles=handles, fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    return ax


def _capacity(ax, d: pd.DataFrame, y, scale: float, top: float) -> str:
    """The capacity of each cell's rank as a dashed segment on its row, where it is within three times
    the largest bar; the others' in words, returned ('' for none: a 64 GiB host beside 5 MiB bars would
    flatten them)."""
    cap = d["mem_capacity_bytes"].to_numpy(float) if "mem_capacity_bytes" in d else np.full(len(d), np.nan)
    near = cap <= 3 * top
    for k in np.flatnonzero(near):
        ax.plot([cap[k] / scale] * 2, [y[k] - 0.45, y[k] + 0.45], ls="--", color="#b00", lw=1,
                label="capacity of a rank" if k == np.flatnonzero(near)[0] else None)
    far = cap[~near & ~np.isnan(cap)]
    if not len(far):
        return ""
    lo, hi = far.min() / 2**30, far.max() / 2**30
    return f"{lo:.1f} GiB" if f"{lo:.1f}" == f"{hi:.1f}" else f"{lo:.1f}-{hi:.1f} GiB"


def _bytes(v: float) -> str:
    """A tick of a log byte axis: 1000 -> '1 kB', 1e7 -> '10 MB'."""
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if v >= size:
            return f"{v / size:g} {unit}"
    return f"{v:g} B"


def call_ranks(calls: pd.DataFrame) -> pd.Series:
    """How many ranks each recorded call spans: its group's size, else its cell's world size; 0
    where neither is known."""
    if "group_size" in calls:
        ranks = calls["group_size"].fillna(calls["world_size"]) if "world_size" in calls else calls["group_size"]
    else:
        ranks = calls["world_size"] if "world_size" in calls else pd.Series(0, index=calls.index)
    return pd.to_numeric(ranks, errors="coerce").fillna(0).astype(int)


def collectives(calls: pd.DataFrame) -> pd.DataFrame:
    """The recorded calls that are collectives: a call of one rank moves nothing between devices
    (it returns at once, at any "bandwidth"), so it is left out."""
    return calls[call_ranks(calls) != 1] if len(calls) else calls


def collective_bandwidth(annotated: pd.DataFrame, ax=None):
    """Achieved bus bandwidth of every recorded collective against the machine's sweep curve (from
    :func:`bench.comm.model.annotate_comm`): calls far below it are flagged in the report. Calls of
    one rank are not collectives and are not drawn."""
    ax = _ax(ax, (WIDTH_IN, 3.8))
    d = collectives(annotated.dropna(subset=["busbw_gbs", "size_bytes"]))
    d = d.assign(_ranks=call_ranks(d))
    styles = ["-", "--", ":", "-."]
    sizes = sorted(d["_ranks"].unique())
    for k, (op, g) in enumerate(d.groupby("op_norm")):
        color = f"C{k % 10}"
        ax.scatter(g["size_bytes"], g["busbw_gbs"], s=6, color=color, label=f"{op} (recorded)")
        # The curve depends on how many ranks the call spans: one line per group size, never one
        # line zigzagging between them.
        for n, c in g.groupby("_ranks"):
            c = c.drop_duplicates("size_bytes").sort_values("size_bytes")
            ax.plot(c["size_bytes"], c["curve_busbw_gbs"], lw=0.8, color=color,
                    ls=styles[sizes.index(n) % len(styles)], label=f"{op} curve, {n} ranks" if n else None)
    ax.set_xscale("log")
    # plain tick labels: the default log labels are mathtext, which the report turns off
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: _bytes(v)))
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("bus bandwidth (GB/s)")
    ax.set_title("recorded collectives against the machine's curve (lines)", fontsize=9)
    if len(d):
        ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    return ax


TELEMETRY_UNITS = {"gpu_util_pct": "GPU util (%)", "power_w": "power (W)", "sm_active_pct": "SM active (%)",
                   "cpu_util_pct": "host CPU (%)", "other_cpu_cores": "cores used by others"}


def telemetry_small_multiples(samples: pd.DataFrame, cells: pd.DataFrame, metric: str, *, limit: int = 12):
    """One small panel per cell (its timed window, every device the sampler watched: devices the
    cell did not use show as idle lines), the cell's name on top, units on the y axis. The
    ``limit`` cells with the longest windows are drawn."""
    d = cells[cells["timed_start_unix"].notna()].copy() if "timed_start_unix" in cells else cells.iloc[0:0]
    d["span"] = d["timed_end_unix"] - d["timed_start_unix"]
    d = d.sort_values("span", ascending=False).head(limit)
    s = samples[samples["metric"] == metric]
    colors = {dev: f"C{k % 10}" for k, dev in enumerate(sorted(s["device"].dropna().unique(), key=str))}
    n = max(len(d), 1)
    cols = min(4, n)
    rows = -(-n // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(2.4 * cols, 1.7 * rows), squeeze=False, sharey=True)
    for ax, (_, r) in zip(axes.flat, d.iterrows()):
        w = s[(s["t"] >= r["timed_start_unix"]) & (s["t"] <= r["timed_end_unix"])]
        for dev, g in w.groupby("device"):
            ax.plot(g["t"] - r["timed_start_unix"], g["value"], lw=0.8, label=str(dev), color=colors[dev])
        ax.set_title(f"{r['workload']} {cell_label(r)}"[:48], fontsize=6)
        ax.tick_params(labelsize=6)
    for ax in axes.flat[len(d):]:
        ax.axis("off")
    for ax in axes[:, 0]:
        ax.set_ylabel(TELEMETRY_UNITS.get(metric, metric), fontsize=6)
    for ax in axes[-1, :]:
        ax.set_xlabel("s into the timed steps", fontsize=6)
    fig.suptitle(f"{TELEMETRY_UNITS.get(metric, metric)} per cell", fontsize=8)
    # Which line is which device: one colour per device in every panel, one legend for all.
    if len(colors) > 1:
        from matplotlib.lines import Line2D

        fig.legend([Line2D([], [], color=c, lw=0.8) for c in colors.values()], [str(d) for d in colors],
                   title="device", loc="upper right", fontsize=6, title_fontsize=6, ncol=min(8, len(colors)),
                   frameon=False)
    return axes.flat[0]


def save(ax, path) -> None:
    """Write the Axes' figure as PNG and close it."""
    fig = ax.figure
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
