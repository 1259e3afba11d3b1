"""Tables and the rate-vs-latency curve of serving runs, for docs/guides/serving.md and the report.

``python -m bench.serve.tables RUN [RUN...] [--curve OUT.png]`` prints, per world size, a markdown
table of placements x policies x load levels (p50, p99, achieved requests/s, parity), then the
noisy-neighbour victim latencies and the sweep's rate-vs-p99 points; ``--curve`` also draws them.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import pandas as pd

from bench.results.run import load_run
from bench.results.store import read_table


def ms(v: float) -> str:
    """Seconds as milliseconds with two decimals; '-' for NA."""
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


#: a table of one serving question: its title, its column heads, its rows (texts), which columns
#: hold numbers (aligned right)
LEVEL_HEAD = ["placement", "policy", "load", "req/s", "capacity", "limited by", "p50 ms", "p99 ms", "n", "util",
              "imbalance", "parity err", "steady"]
LEVEL_NUMERIC = {"req/s", "capacity", "p50 ms", "p99 ms", "n", "util", "imbalance", "parity err"}
NOISY_HEAD = ["placement", "policy", "ws", "victim mean ms alone", "with flood", "victim p50 alone", "with flood",
              "victim p90 alone", "with flood"]


def _text(v) -> str:
    """A text cell; '-' for NA."""
    return v if isinstance(v, str) and v else "-"


def fmt(v, spec: str) -> str:
    """A value in ``spec``; '-' for NA."""
    return "-" if v is None or pd.isna(v) else format(v, spec)


def level_rows(cells: pd.DataFrame) -> list[tuple[str, list[list[str]]]]:
    """Per world size, device and workload of the load levels: (title, rows under LEVEL_HEAD). A
    cell that did not run holds its status and reason in the req/s column."""
    lv = cells[cells["serve_scenario"] == "levels"]
    out = []
    for (ws, gpu, _), g in lv.groupby(["world_size", "gpu", "workload"]):
        first = g.iloc[0]
        rows = []
        for _, r in g.iterrows():
            head = [str(r["strategy"]), str(r["serve_policy"]), str(r["serve_load"])]
            if r["status"] != "ok":
                rows.append(head + [f"{r['status']}: {str(r['reason'])[:60]}"] + [""] * (len(LEVEL_HEAD) - 4))
                continue
            rows.append(head + [fmt(r["serve_achieved_rps"], ".1f"), fmt(r.get("serve_capacity_rps"), ".0f"),
                                _text(r.get("serve_limit_kind")),
                                ms(r["latency_p50_s"]), ms(r["latency_p99_s"]),
                                fmt(r["latency_n"], ".0f"), fmt(r["util_mean"], ".0%"),
                                fmt(r["util_imbalance"], ".2f"), fmt(r["parity_rel_err"], ".1e"), _steady(r)])
        out.append((f"{ws} x {gpu}, {first['workload']} ({first['serve_task']}, {first['precision']})", rows))
    return out


def markdown(head: list[str], rows: list[list[str]], numeric: set[str] = frozenset()) -> list[str]:
    """A markdown table: the head, the alignment line (numbers right), the rows."""
    return (["| " + " | ".join(head) + " |", "|" + "".join("---:|" if h in numeric else "---|" for h in head)]
            + ["| " + " | ".join(r) + " |" for r in rows])


def levels_table(cells: pd.DataFrame) -> str:
    out = []
    for title, rows in level_rows(cells):
        ws, _, rest = title.partition(", ")
        out.append(f"\n**{ws}**, {rest}\n")
        out += markdown(LEVEL_HEAD, rows, LEVEL_NUMERIC)
    return "\n".join(out)


def noisy_rows(cells: pd.DataFrame, tenants: pd.DataFrame) -> list[list[str]]:
    """The noisy-neighbour victim's latencies alone and under a flood, rows under NOISY_HEAD."""
    nz = cells[cells["serve_scenario"].isin(["noisy-alone", "noisy-flood"])]
    if nz.empty:
        return []
    out = []
    v = tenants[tenants["tenant"] == "victim"].set_index(["run", "cell_id"])
    for (pl, pol, ws), g in nz.groupby(["strategy", "serve_policy", "world_size"]):
        def get(scen, col):
            c = g[g["serve_scenario"] == scen]
            key = (c["run"].iloc[0], c["cell_id"].iloc[0]) if len(c) else None
            return v.loc[key, col] if key is not None and key in v.index else float("nan")
        out.append([str(pl), str(pol), str(ws)] + [ms(get(scen, f"latency_{k}_s")) for k in ("mean", "p50", "p90")
                                                   for scen in ("noisy-alone", "noisy-flood")])
    return out


def noisy_table(cells: pd.DataFrame, tenants: pd.DataFrame) -> str:
    rows = noisy_rows(cells, tenants)
    return "\n".join([""] + markdown(NOISY_HEAD, rows, set(NOISY_HEAD[2:]))) if rows else ""


def curve(cells: pd.DataFrame) -> pd.DataFrame:
    sw = cells[(cells["serve_scenario"] == "sweep") & (cells["status"] == "ok")]
    return sw[["strategy", "serve_policy", "world_size", "serve_offered_rps", "serve_achieved_rps", "latency_p50_s",
               "latency_p99_s", "latency_n", "slo_s", "slo_met"]].sort_values(
        ["strategy", "serve_policy", "world_size", "serve_offered_rps"])


def plot(cv: pd.DataFrame, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, ax = plt.subplots(figsize=(6, 4))
    for key, g in cv.groupby(["strategy", "serve_policy", "world_size"]):
        ax.plot(g["serve_offered_rps"], g["latency_p99_s"] * 1e3, marker="o", label=f"{key[0]}/{key[1]} x{key[2]}")
    if len(cv) and cv["slo_s"].notna().any():
        ax.axhline(cv["slo_s"].dropna().iloc[0] * 1e3, ls="--", c="k", lw=0.8, label="p99 target")
    ax.set_xlabel("offered rate (requests/s)")
    ax.set_ylabel("p99 latency (ms)")
    ax.set_yscale("log")
    # plain tick labels: the default log labels are mathtext, which a page drawn with
    # text.parse_math off (run names may hold "$") would show as raw source
    ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(matplotlib.ticker.FuncFormatter(
        lambda v, _: f"{v:g}" if v > 0 and round(v / 10 ** math.floor(math.log10(v))) in (2, 5) else ""))
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


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
