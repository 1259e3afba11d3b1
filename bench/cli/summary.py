"""The end of ``parbench run`` on the terminal: a compact summary that fits 100 columns (counts by
status, the cells that need a look, the best cell per workload, backend and world size, skipped
cells by reason), or with ``--table`` the table of every cell. Every value from a run is printed as
plain text: names and reasons can hold brackets (never markup).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from bench.core import knobs
from bench.results.derived import parity_failure

if TYPE_CHECKING:
    from bench.results.run import Run

#: the widest the summary gets, in columns
WIDTH = 100
#: cells that need a look, listed before "and N more"
LOOK_MAX = 8


def end_console() -> Console:
    """stdout, at most WIDTH columns wide (exactly WIDTH when it is not a terminal)."""
    probe = Console()
    return Console(width=min(probe.width, WIDTH) if probe.is_terminal else WIDTH)


def _fmt(v, spec: str) -> str:
    return "" if v is None or pd.isna(v) else format(v, spec)


def _name(r, vary: list[str]) -> str:
    """'gpt-tiny ddp gloo x2' with its layout, and the training knobs of ``vary`` (those the run varies)."""
    extra = "".join(f" {r[c]}" for c in ("mesh", "schedule") if c in r and pd.notna(r[c]) and str(r[c]))
    trained = knobs.short(dict(r), vary)
    return f"{r['workload']} {r['strategy']}{extra} {r['backend']} x{r['world_size']}" + (" " + trained) * bool(trained)


def _clip(text: str, width: int) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= width else text[: width - 3] + "..."


def needs_a_look(cells: pd.DataFrame) -> list[str]:
    """Why each cell that needs a look does, worst first: failed or timed out, parity failed, not
    stable (the run flags it as noisy)."""
    out, vary = [], knobs.varying(cells)
    for _, r in cells[cells["status"].isin(["failed", "timeout"])].iterrows():
        out.append(f"{_name(r, vary)}: {r['status']}: {r.get('reason') or ''}")
    ok = cells[cells["status"] == "ok"]
    if "parity_ok" in ok:
        for _, r in ok[ok["parity_ok"] == False].iterrows():  # noqa: E712 - NA is not failed
            out.append(f"{_name(r, vary)}: {parity_failure(r)}")
    if "stable" in ok:
        for _, r in ok[ok["stable"] == False].iterrows():  # noqa: E712
            out.append(f"{_name(r, vary)}: not stable: {r.get('noise') or ''}")
    return out


def best_cells(cells: pd.DataFrame) -> pd.DataFrame:
    """Per workload, backend and world size, the fastest ok cell that trains the one model (parity
    not failed, not an ensemble of independent models), with how many cells ran there (``ran``)."""
    ran = cells[cells["status"] == "ok"]
    ok = ran
    if "parity_ok" in ok:
        ok = ok[ok["parity_ok"].fillna(True).astype(bool)]
    if "role" in ok:
        ok = ok[ok["role"].fillna("") != "independent"]
    ok = ok[ok["step_time_median_s"].notna()] if "step_time_median_s" in ok else ok.iloc[:0]
    if ok.empty:
        return ok
    keys = ["workload", "backend", "world_size"]
    best = ok.loc[ok.groupby(keys)["step_time_median_s"].idxmin()]
    return best.assign(ran=best.set_index(keys).index.map(ran.groupby(keys).size())).sort_values(keys)


def print_summary(run: Run | Path, console: Console | None = None, *, table: bool = False) -> None:
    """The end of a run: the compact summary, or with ``table`` every cell."""
    from bench.results.run import load_run

    run = load_run(run)
    cells = run.training
    console = console or end_console()
    if table:
        print_table(run.path, cells, console)
        return
    counts = cells["status"].value_counts()
    order = [s for s in ("ok", "failed", "timeout", "skipped") if s in counts] + \
        [s for s in counts.index if s not in ("ok", "failed", "timeout", "skipped")]
    console.print(Text(f"parbench run: {len(cells)} cells: " + ", ".join(f"{counts[s]} {s}" for s in order)))
    look = needs_a_look(cells)
    if look:
        console.print(Text(f"needs a look ({len(look)}):"))
        for line in look[:LOOK_MAX]:
            console.print(Text("  " + _clip(line, console.width - 2)))
        if len(look) > LOOK_MAX:
            console.print(Text(f"  ... and {len(look) - LOOK_MAX} more (the report, or --table)"))
    _print_best(cells, console)
    skipped = cells[cells["status"] == "skipped"]
    if len(skipped):
        console.print(Text(f"skipped ({len(skipped)}), by reason:"))
        for reason, n in skipped["reason"].fillna("").value_counts().items():
            console.print(Text("  " + _clip(f"{n} x {reason}", console.width - 2)))
    console.print(Text(f"every cell: parbench report {run.path} (or --table on the run)"))


def _print_best(cells: pd.DataFrame, console: Console) -> None:
    best, vary = best_cells(cells), knobs.varying(cells)
    if best.empty:
        return
    t = Table(title=Text("the fastest cell per workload, backend and world size"), box=box.SIMPLE_HEAD,
              title_justify="left", pad_edge=False, show_edge=False)
    for col, kw in (("workload", {}), ("backend", {}), ("ws", {"justify": "right"}), ("fastest", {}),
                    ("ms/step", {"justify": "right"}), ("samples/s", {"justify": "right"}),
                    ("cells ok", {"justify": "right"})):
        t.add_column(col, overflow="ellipsis", no_wrap=True, **kw)
    for _, r in best.iterrows():
        extra = "".join(f" {r[c]}" for c in ("mesh", "schedule") if c in r and pd.notna(r[c]) and str(r[c]))
        trained = knobs.short(dict(r), vary)
        extra += f" {trained}" if trained else ""
        t.add_row(Text(str(r["workload"])), Text(str(r["backend"])), str(r["world_size"]),
                  Text(f"{r['strategy']}{extra}"), _fmt(r["step_time_median_s"] * 1e3, ".1f"),
                  _fmt(r.get("throughput_samples_s"), ".1f"), str(r["ran"]))
    console.print(t)


def print_table(run_dir: Path, cells: pd.DataFrame, console: Console) -> None:
    """The cells that ran, with the registry's summary columns; skipped cells grouped by reason."""
    from bench.results.columns import shown

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
