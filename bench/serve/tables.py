"""Tables and the rate-vs-latency curve of serving runs, for docs/SERVING.md and the report.

``python -m bench.serve.tables RUN [RUN...] [--curve OUT.png]`` prints, per world size, a markdown
table of placements x policies x load levels (p50, p99, achieved requests/s, parity), then the
noisy-neighbour victim latencies and the sweep's rate-vs-p99 points; ``--curve`` also draws them.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from bench.results.store import load_run, read_table


def _ms(v: float) -> str:
    return "-" if pd.isna(v) else f"{v * 1e3:.2f}"


def load(runs: list[str]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Serving cells and per-tenant rows of several runs (cell ids made unique per run)."""
    cells, tenants = [], []
    for r in runs:
        c, _, meta = load_run(r)
        c = c[c.get("mode") == "serve"] if "mode" in c else c.iloc[:0]
        c = c.assign(run=Path(r).name, gpu=c["gpu_name"].fillna(c["device"]))
        cells.append(c)
        tenants.append(read_table(r, "serve_tenants").assign(run=Path(r).name))
    return pd.concat(cells, ignore_index=True), pd.concat(tenants, ignore_index=True)


def _steady(r: pd.Series) -> str:
    """'yes', 'no: why' (bench.serve.steady.steady_flags) or '-' (closed loop, or a run from before
    the flag existed)."""
    stable = r.get("stable")
    if stable is None or pd.isna(stable):
        return "-"
    return "yes" if stable else f"no: {str(r.get('noise') or '')[:70]}"


def levels_table(cells: pd.DataFrame) -> str:
    lv = cells[cells["serve_scenario"] == "levels"]
    out = []
    for (ws, gpu, _), g in lv.groupby(["world_size", "gpu", "workload"]):
        first = g.iloc[0]
        out.append(f"\n**{ws} x {gpu}**, {first['workload']} ({first['serve_task']}, {first['precision']})\n")
        out.append("| placement | policy | load | req/s | p50 ms | p99 ms | n | util | imbalance | parity err "
                   "| steady |")
        out.append("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|")
        for _, r in g.iterrows():
            if r["status"] != "ok":
                out.append(f"| {r['strategy']} | {r['serve_policy']} | {r['serve_load']} | {r['status']}: "
                           f"{str(r['reason'])[:60]} | | | | | | | |")
                continue
            out.append(f"| {r['strategy']} | {r['serve_policy']} | {r['serve_load']} | {r['serve_achieved_rps']:.1f} | "
                       f"{_ms(r['latency_p50_s'])} | {_ms(r['latency_p99_s'])} | {r['latency_n']} | "
                       f"{r['util_mean']:.0%} | {r['util_imbalance']:.2f} | {r['parity_rel_err']:.1e} | "
                       f"{_steady(r)} |")
    return "\n".join(out)


def noisy_table(cells: pd.DataFrame, tenants: pd.DataFrame) -> str:
    nz = cells[cells["serve_scenario"].isin(["noisy-alone", "noisy-flood"])]
    if nz.empty:
        return ""
    out = ["\n| placement | policy | ws | victim mean ms alone | with flood | victim p50 alone | with flood | "
           "victim p90 alone | with flood |", "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    v = tenants[tenants["tenant"] == "victim"].set_index(["run", "cell_id"])
    for (pl, pol, ws), g in nz.groupby(["strategy", "serve_policy", "world_size"]):
        def get(scen, col):
            c = g[g["serve_scenario"] == scen]
            return v.loc[(c["run"].iloc[0], c["cell_id"].iloc[0]), col] if len(c) else float("nan")
        out.append(f"| {pl} | {pol} | {ws} | {_ms(get('noisy-alone', 'latency_mean_s'))} | "
                   f"{_ms(get('noisy-flood', 'latency_mean_s'))} | {_ms(get('noisy-alone', 'latency_p50_s'))} | "
                   f"{_ms(get('noisy-flood', 'latency_p50_s'))} | {_ms(get('noisy-alone', 'latency_p90_s'))} | "
                   f"{_ms(get('noisy-flood', 'latency_p90_s'))} |")
    return "\n".join(out)


def curve(cells: pd.DataFrame) -> pd.DataFrame:
    sw = cells[(cells["serve_scenario"] == "sweep") & (cells["status"] == "ok")]
    return sw[["strategy", "serve_policy", "world_size", "serve_offered_rps", "serve_achieved_rps", "latency_p50_s",
               "latency_p99_s", "latency_n", "slo_s", "slo_met"]].sort_values(
        ["strategy", "serve_policy", "world_size", "serve_offered_rps"])


def plot(cv: pd.DataFrame, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for key, g in cv.groupby(["strategy", "serve_policy", "world_size"]):
        ax.plot(g["serve_offered_rps"], g["latency_p99_s"] * 1e3, marker="o", label=f"{key[0]}/{key[1]} x{key[2]}")
    if len(cv) and cv["slo_s"].notna().any():
        ax.axhline(cv["slo_s"].dropna().iloc[0] * 1e3, ls="--", c="k", lw=0.8, label="p99 target")
    ax.set_xlabel("offered rate (requests/s)")
    ax.set_ylabel("p99 latency (ms)")
    ax.set_yscale("log")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.serve.tables")
    p.add_argument("runs", nargs="+")
    p.add_argument("--curve", help="write the rate-vs-p99 plot here (PNG)")
    a = p.parse_args(argv)
    cells, tenants = load(a.runs)
    print(levels_table(cells))
    print(noisy_table(cells, tenants))
    cv = curve(cells)
    if len(cv):
        print("\nrate sweep (p99 against the target):\n" + cv.to_string(index=False))
        if a.curve:
            plot(cv, a.curve)
    return 0


if __name__ == "__main__":
    sys.exit(main())
