"""The serving part of the report: which placement and policy to serve with, and the tables of a
``parbench serve`` run as HTML tables (levels, the rate sweep, the noisy neighbour).

The answer, per workload and world size, comes from the serving rows alone: of the cells that ran
(status ok), served what one device serves (parity not failed) and met the p99 latency target
(``slo_met``: p99 reported and within the target, the rate kept up with, the backlog steady), the
placement and policy with the highest achieved rate. Without a target, or when no cell met it, there
is no answer, and the reason says which.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from bench.results.store import read_table
from bench.serve import tables

#: the scenarios whose rate is the service's own (a noisy neighbour's flood is not)
RATED = ("levels", "sweep")


@dataclass(frozen=True, kw_only=True)
class ServePick:
    workload: str
    world_size: int
    use: str | None  # "placement/policy" (policy left out where there is none); None: no answer
    rate_rps: float | None  # the achieved rate of what to use
    p99_ms: float | None  # its p99
    target_ms: float | None  # the p99 target (None: none was set)
    because: str

    def line(self) -> str:
        """The pick as one line of plain text."""
        head = f"{self.workload} x{self.world_size}: "
        return head + (f"serve with {self.use}; {self.because}" if self.use else f"no decision: {self.because}")


def _name(r: pd.Series) -> str:
    policy = str(r.get("serve_policy") or "")
    return f"{r['strategy']}/{policy}" if policy and policy not in ("-", "<NA>") else str(r["strategy"])


def _pick(g: pd.DataFrame, workload: str, ws: int) -> ServePick:
    """The answer for one workload and world size from its serving rows."""
    none = dict(workload=workload, world_size=ws, use=None, rate_rps=None, p99_ms=None)
    rated = g[g["serve_scenario"].isin(RATED)] if "serve_scenario" in g else g
    if rated.empty:
        return ServePick(**none, target_ms=None, because="no load-level or sweep cell: a noisy neighbour's flood "
                                                         "is not a rate of the service's own")
    ran = rated[rated["status"] == "ok"]
    if "parity_ok" in ran:
        ran = ran[ran["parity_ok"].map(lambda v: v is None or pd.isna(v) or bool(v)).astype(bool)]
    if ran.empty:
        return ServePick(**none, target_ms=None, because=f"none of its {len(rated)} serving cells ran and matched "
                                                         "one device (see the failed and skipped cells)")
    targets = pd.to_numeric(ran["slo_s"], errors="coerce").dropna() if "slo_s" in ran else pd.Series(dtype=float)
    fastest = ran.loc[pd.to_numeric(ran["serve_achieved_rps"], errors="coerce").idxmax()]
    if targets.empty:
        return ServePick(**none, target_ms=None, because=(
            "no latency target was set (parbench serve --slo-ms MS picks what meets it); the highest rate "
            f"answered was {_name(fastest)} at {fastest['serve_achieved_rps']:.1f} req/s"
            f"{_p99(fastest)}"))
    target = float(targets.iloc[0])
    met = ran[ran["slo_met"].map(_true).astype(bool)] if "slo_met" in ran else ran.iloc[:0]
    if met.empty:
        p99 = pd.to_numeric(ran["latency_p99_s"], errors="coerce")
        best = (f"the lowest p99 was {p99.min() * 1e3:.1f} ms ({_name(ran.loc[p99.idxmin()])})" if p99.notna().any()
                else "no cell reported a p99 (too few requests a cell)")
        return ServePick(**none, target_ms=target * 1e3, because=(
            f"no placement and policy met the p99 target of {target * 1e3:g} ms at any rate tried; {best}"))
    rate = pd.to_numeric(met["serve_achieved_rps"], errors="coerce")
    win = met.loc[rate.idxmax()]
    per = met.assign(_rate=rate, _name=met.apply(_name, axis=1)).groupby("_name")["_rate"].max().sort_values()
    others = per.drop(_name(win))
    because = (f"the highest rate that met the p99 target of {target * 1e3:g} ms: {win['serve_achieved_rps']:.1f} "
               f"req/s{_p99(win)}")
    if len(others):
        because += f"; next: {others.index[-1]} at {others.iloc[-1]:.1f} req/s"
    left = sorted(set(ran.apply(_name, axis=1)) - set(per.index))
    if left:
        because += f"; never met it: {', '.join(left)}"
    return ServePick(workload=workload, world_size=ws, use=_name(win), rate_rps=float(win["serve_achieved_rps"]),
                     p99_ms=float(win["latency_p99_s"]) * 1e3, target_ms=target * 1e3, because=because)


def _true(v) -> bool:
    """A flag that is known and true (NA is not true)."""
    return v is not None and not pd.isna(v) and bool(v)


def _p99(r: pd.Series) -> str:
    v = r.get("latency_p99_s")
    return "" if v is None or pd.isna(v) else f" (p99 {v * 1e3:.1f} ms)"


def serve_picks(serving: pd.DataFrame) -> list[ServePick]:
    """One answer per workload and world size of the serving rows."""
    if serving.empty:
        return []
    return [_pick(g, str(wl), int(ws)) for (wl, ws), g in serving.groupby(["workload", "world_size"], sort=True)]


def _sweep_rows(cells: pd.DataFrame) -> list[list[str]]:
    cv = tables.curve(cells)
    fmt, ms = tables.fmt, tables.ms
    return [[str(r["strategy"]), str(r["serve_policy"]), str(r["world_size"]), fmt(r["serve_offered_rps"], ".1f"),
             fmt(r["serve_achieved_rps"], ".1f"), ms(r["latency_p50_s"]), ms(r["latency_p99_s"]),
             ms(r["slo_s"]), "yes" if _true(r["slo_met"]) else "no"] for _, r in cv.iterrows()]


SWEEP_HEAD = ["placement", "policy", "ws", "offered req/s", "req/s", "p50 ms", "p99 ms", "target ms", "met"]


def serve_section(run_dir: Path, serving: pd.DataFrame, out: Path, embed) -> dict | None:
    """The serving section: the answers, the tables (title, head, rows, numeric columns) and the
    rate-vs-p99 curve (``embed(path)`` turns a written PNG into what the page embeds)."""
    if serving.empty:
        return None
    cells = serving.assign(run=run_dir.name, gpu=serving["gpu_name"].fillna(serving["device"]))
    scenario = "serve_scenario" in cells
    found = []
    for title, rows in (tables.level_rows(cells) if scenario else []):
        found.append({"title": f"Load levels, {title}", "head": tables.LEVEL_HEAD, "rows": rows,
                      "numeric": tables.LEVEL_NUMERIC})
    sweep = _sweep_rows(cells) if scenario else []
    if sweep:
        found.append({"title": "Rate sweep against the p99 target", "head": SWEEP_HEAD, "rows": sweep,
                      "numeric": set(SWEEP_HEAD[2:8])})
    if scenario and (run_dir / "serve_tenants.parquet").exists():
        noisy = tables.noisy_rows(cells, read_table(run_dir, "serve_tenants").assign(run=run_dir.name))
        if noisy:
            found.append({"title": "Noisy neighbour: the victim's latency alone and under a flood",
                          "head": tables.NOISY_HEAD, "rows": noisy, "numeric": set(tables.NOISY_HEAD[2:])})
    images = []
    cv = tables.curve(cells) if scenario else pd.DataFrame()
    if len(cv):
        path = out / "serve-rate-vs-p99.png"
        tables.plot(cv, str(path))
        images.append(embed(path))
    return {"picks": serve_picks(serving), "tables": found, "images": images}
