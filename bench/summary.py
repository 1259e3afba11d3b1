"""Short terminal tables: the end of `parbench run` and `parbench compare`."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from rich.console import Console
from rich.table import Table


def _fmt(v, spec: str) -> str:
    return "" if v is None or pd.isna(v) else format(v, spec)


def print_summary(run_dir: Path, console: Console | None = None) -> None:
    from bench.results import load_run

    cells, _, _ = load_run(run_dir)
    console = console or Console(width=None if Console().is_terminal else 150)
    t = Table(title=f"parbench run {run_dir}")
    for col in ("workload", "strategy", "backend", "ws", "status", "step ms (median)", "samples/s",
                "scaling eff", "MFU", "parity"):
        t.add_column(col)
    shown = cells[cells["status"] != "skipped"]
    for _, r in shown.iterrows():
        parity = "" if pd.isna(r.get("parity_ok")) else ("ok" if r["parity_ok"] else f"FAIL {r['parity_rel_err']:.1e}")
        status = r["status"] if r["status"] == "ok" else f"{r['status']}: {str(r['reason'])[:60]}"
        t.add_row(str(r["workload"]), str(r["strategy"]), str(r["backend"]), str(r["world_size"]), status,
                  _fmt(r["step_time_median_s"] * 1e3 if pd.notna(r["step_time_median_s"]) else None, ".2f"),
                  _fmt(r["throughput_samples_s"], ".1f"), _fmt(r["scaling_efficiency"], ".2f"),
                  _fmt(r["mfu"], ".1%"), parity)
    console.print(t)
    skipped = cells[cells["status"] == "skipped"]
    if len(skipped):
        console.print(f"{len(skipped)} cells skipped:")
        for reason, g in skipped.groupby("reason"):
            which = ", ".join(f"{r.workload} {r.strategy} {r.backend} x{r.world_size}" for r in g.itertuples())
            console.print(f"  {reason}: {which}", soft_wrap=True)


def print_compare(table: pd.DataFrame, threshold: float, console: Console | None = None) -> None:
    console = console or Console(width=None if Console().is_terminal else 150)
    t = Table(title=f"parbench compare (threshold {threshold:.1%})")
    for col in ("workload", "strategy", "backend", "ws", "base samples/s", "current samples/s", "change",
                "CIs overlap", "verdict"):
        t.add_column(col)
    for _, r in table.iterrows():
        t.add_row(r["workload"], r["strategy"], r["backend"], r["world_size"], _fmt(r["base_tput"], ".1f"),
                  _fmt(r["cur_tput"], ".1f"), _fmt(r["change"], "+.1%"),
                  "yes" if r["ci_overlap"] is True else "no", r["verdict"])
    console.print(t)
