"""Short terminal tables: the end of `parbench run` and `parbench compare`."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from rich.console import Console
from rich.table import Table
from rich.text import Text


def _fmt(v, spec: str) -> str:
    return "" if v is None or pd.isna(v) else format(v, spec)


def print_summary(run_dir: Path, console: Console | None = None) -> None:
    """The cells that ran, with the registry's summary columns; skipped cells grouped by reason.
    Every value is printed as plain text: names and reasons can hold brackets (never markup)."""
    from bench.results.columns import shown
    from bench.results.store import load_run

    cells, _, _ = load_run(run_dir)
    console = console or Console(width=None if Console().is_terminal else 150)
    cols = [m for m in shown("summary", cells.columns) if m.name != "status"]
    t = Table(title=Text(f"parbench run {run_dir}"))
    for m in cols:
        t.add_column(Text(m.title))
    t.add_column("status")
    t.add_column("parity")
    for _, r in cells[cells["status"] != "skipped"].iterrows():
        parity = "" if pd.isna(r.get("parity_ok")) else ("ok" if r["parity_ok"] else f"FAIL {r['parity_rel_err']:.1e}")
        status = r["status"] if r["status"] == "ok" else f"{r['status']}: {str(r['reason'])[:80]}"
        vals = []
        for m in cols:
            v = m.show(r.get(m.name))
            if m.name == "scaling_efficiency" and v and pd.notna(r.get("scaling_note")):
                v += " (!)"  # never a plain number when it cannot be read as one
            vals.append(Text(v))
        t.add_row(*vals, Text(status), Text(parity))
    console.print(t)
    skipped = cells[cells["status"] == "skipped"]
    if len(skipped):
        console.print(Text(f"{len(skipped)} cells skipped:"))
        for reason, g in skipped.groupby("reason"):
            which = ", ".join(f"{r.workload} {r.strategy} {r.backend} x{r.world_size}" for r in g.itertuples())
            console.print(Text(f"  {reason}: {which}"), soft_wrap=True)
