"""docs/RESULTS.md and the README's result block, built from the compact tables in docs/evidence/.

    python -m tools.results_page                    # write docs/RESULTS.md, the README's result block, its figure
    python -m tools.results_page --check            # exit 1 if either document differs from what the tables give
    python -m tools.results_page --readme-table NAME [--where COL=V[,V]]   # print the README block for NAME

Each table in docs/evidence/ has a sidecar NAME.json (what the table holds, the runs it came from).
Every figure on the page is computed here from the tables; each table's description is its
sidecar's ``summary`` or ``what`` field. The README's block sits between ``<!-- result-table: NAME [COL=V,...] -->`` and
``<!-- /result-table -->``: naming another evidence table there and rerunning this script swaps
the README's table and figure.
"""

from __future__ import annotations

import argparse
import functools
import json
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from bench.core.metrics import BREAKDOWN_GAP_MAX

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
EVIDENCE = DOCS / "evidence"
RESULTS_MD = DOCS / "RESULTS.md"
README = ROOT / "README.md"
FIGURE = DOCS / "figures" / "readme-result.png"
COMMAND = "python -m tools.results_page"
BLOCK = re.compile(r"(<!-- result-table: (?P<spec>[^>]*?) -->\n)(?P<body>.*?)(<!-- /result-table -->)", re.S)
DETAILS_FROM = 25  # tables longer than this fold away under a summary line


# ---------------------------------------------------------------------------------------------- data


@dataclass
class Evidence:
    name: str
    path: Path
    table: pd.DataFrame
    meta: dict

    @property
    def sources(self) -> list[dict]:
        """The runs the table came from; a nested record (``cells_from``) counts as one run."""
        out = []
        for s in self.meta.get("sources", []):
            nested = [v for v in s.values() if isinstance(v, dict) and "run_id" in v]
            out.extend(nested if len(s) == 1 and nested else [s])
        return out


def evidence_names() -> list[str]:
    return sorted(p.stem for p in EVIDENCE.glob("*.json") if _table_path(p.stem) is not None)


def _table_path(name: str) -> Path | None:
    for ext in ("parquet", "csv"):
        if (EVIDENCE / f"{name}.{ext}").exists():
            return EVIDENCE / f"{name}.{ext}"
    return None


@functools.cache
def load(name: str) -> Evidence:
    """The table and sidecar NAME (cached: the views only read them)."""
    path = _table_path(name)
    if path is None:
        raise SystemExit(f"results_page: no table docs/evidence/{name}.parquet or .csv")
    table = pd.read_parquet(path) if path.suffix == ".parquet" else pd.read_csv(path)
    return Evidence(name, path, table, json.loads((EVIDENCE / f"{name}.json").read_text()))


def present(x) -> bool:
    if x is None or isinstance(x, (list, dict, tuple)):
        return x is not None
    try:
        return not bool(pd.isna(x))
    except (TypeError, ValueError):
        return True


# ---------------------------------------------------------------------------------------- formatting


def ms(s) -> str:
    return f"{s * 1e3:.1f}" if present(s) else "–"


def interval(lo, hi) -> str:
    return f"[{lo * 1e3:.1f}, {hi * 1e3:.1f}]" if present(lo) and present(hi) else "–"


def pct(x, digits: int = 1) -> str:
    return f"{x * 100:.{digits}f}%" if present(x) else "–"


def num(x, fmt: str = "{:.2f}") -> str:
    return fmt.format(x) if present(x) else "–"


def cell(x) -> str:
    """A table value as markdown text: pipes escaped, emoji codes (``:warning:``) dropped."""
    if not present(x):
        return "–"
    if isinstance(x, float):
        return f"{x:g}"
    return re.sub(r"^:[a-z_]+:\s*", "", str(x)).replace("|", "\\|").replace("\n", " ").strip() or "–"


def md_table(header: list[str], rows: list[list[str]], fold: bool = True, group: bool = False) -> list[str]:
    """A markdown table; ``group``: the first column is shown only where it changes."""
    if group:
        rows = [[("" if i and r[0] == rows[i - 1][0] else r[0]), *r[1:]] for i, r in enumerate(rows)]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    if fold and len(rows) > DETAILS_FROM:
        return [f"<details><summary>{len(rows)} rows</summary>", "", *lines, "", "</details>"]
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def command(cmd: str) -> str:
    """A recorded command line with the entry point as users type it."""
    for old, new in (("bench/cli.py run", "parbench run"), ("bench/cli_comm.py", "parbench comm"),
                     ("bench/cli_serve.py", "parbench serve")):
        cmd = cmd.replace(old, new)
    return re.sub(r"\s+", " ", cmd).strip()


# ---------------------------------------------------------------------------------------- provenance


def _distinct(values) -> list[str]:
    out: list[str] = []
    for v in values:
        if present(v) and str(v) not in out:
            out.append(str(v))
    return out


def _field(ev: Evidence, key: str, column: str | None = None) -> list[str]:
    vals = [s.get(key) for s in ev.sources]
    if column and column in ev.table.columns:
        vals += list(ev.table[column].dropna().unique())
    return _distinct(vals)


def dates(ev: Evidence) -> list[str]:
    vals = [s.get("date") or (s.get("created_utc") or "")[:10] for s in ev.sources]
    for col in ("run_date", "date"):
        if col in ev.table.columns:
            vals += [str(v)[:10] for v in ev.table[col].dropna().unique()]
    return sorted(_distinct(v for v in vals if v))


def hardware(ev: Evidence) -> str:
    gpus = _field(ev, "gpus") or _field(ev, "machine", "machine")
    driver = _field(ev, "driver")
    text = "; ".join(gpus) if gpus else "not recorded"
    return text + (f" (driver {', '.join(driver)})" if driver else "")


def software(ev: Evidence) -> str:
    parts, missing = [], []
    for label, key, col in (("torch", "torch", "torch"), ("CUDA", "cuda", None), ("NCCL", "nccl", "nccl")):
        vals = _field(ev, key, col)
        if vals:
            parts.append(f"{label} {', '.join(vals)}")
        else:
            missing.append(label)
    text = ", ".join(parts) or "not recorded"
    return text + (f" ({', '.join(missing)}: not recorded)" if parts and missing else "")


def _settings(s: dict) -> str:
    st = dict(s.get("settings") or {})
    text = ", ".join(f"{k} {v}" for k, v in st.items())
    fam, ws = s.get("families"), s.get("world_sizes")
    if fam:
        text += f"; families {', '.join(fam)}"
    if ws:
        text += f"; world sizes {', '.join(str(w) for w in ws)}"
    return text


def commands(ev: Evidence) -> list[str]:
    """One line per distinct command (or recorded settings), labelled by experiment where there are several."""
    seen, out = set(), []
    for s in ev.sources:
        text = f"`{command(s['command'])}`" if s.get("command") else (_settings(s) or None)
        if text is None or text in seen:
            continue
        seen.add(text)
        out.append((s.get("experiment"), text))
    if len(out) == 1:
        return [out[0][1]]
    return [f"{label}: {text}" if label else text for label, text in out]


def provenance(ev: Evidence, repeats: str, spread: str | None) -> list[str]:
    rel = ev.path.relative_to(DOCS).as_posix()
    d = dates(ev)
    lines = [f"- **Hardware:** {hardware(ev)}", f"- **Software:** {software(ev)}",
             f"- **Date:** {', '.join(d) if d else 'not recorded'}"]
    cmds = commands(ev)
    if len(cmds) == 1:
        lines.append(f"- **Command:** {cmds[0]}")
    elif cmds:
        lines += ["- **Commands:**", "", "  <details><summary>" + f"{len(cmds)} commands</summary>", ""]
        lines += [f"  - {c}" for c in cmds] + ["", "  </details>", ""]
    lines.append(f"- **Repeats:** {repeats}")
    if spread:
        lines.append(f"- **Spread:** {spread}")
    lines.append(f"- **Table:** [{rel}]({rel}), {len(ev.table)} rows")
    return lines


# --------------------------------------------------------------------------------------------- views


@dataclass
class View:
    repeats: str
    spread: str | None
    body: list[str]


def _range(values: pd.Series) -> str:
    lo, hi = int(values.min()), int(values.max())
    return str(lo) if lo == hi else f"{lo}-{hi}"


def _repeats_text(df: pd.DataFrame) -> str:
    """'one run per cell, 15 timed steps a cell' or '5 repeats per cell, 20 timed steps a repeat'."""
    reps = df["repeats_done"].dropna() if "repeats_done" in df.columns else pd.Series(dtype=float)
    once = not len(reps) or reps.max() <= 1
    if not once and reps.nunique() > 1 and "timed_steps_total" in df.columns:
        # repeats differ from cell to cell (adaptive repeats): the steps a cell timed in all
        steps = df["timed_steps_total"].dropna()
        tail = f", {_range(steps)} timed steps a cell in all" if len(steps) else ""
        return f"{_range(reps)} repeats per cell" + tail
    col = "timed_steps_total" if once and "timed_steps_total" in df.columns else "steps"
    steps = df[col].dropna() if col in df.columns else pd.Series(dtype=float)
    st = f", {_range(steps)} timed steps a {'cell' if once else 'repeat'}" if len(steps) else ""
    return ("one run per cell" if once else f"{_range(reps)} repeats per cell") + st


def _ci_spread(df: pd.DataFrame) -> str | None:
    if not {"step_time_ci_low_s", "step_time_ci_high_s", "step_time_median_s"} <= set(df.columns):
        return None
    w = ((df.step_time_ci_high_s - df.step_time_ci_low_s) / df.step_time_median_s).dropna()
    if not len(w):
        return None
    return (f"the 95% interval of a cell's median spans {pct(w.median())} of the median "
            f"(median over {len(w)} cells; widest {pct(w.max())})")


def _ok(df: pd.DataFrame) -> pd.DataFrame:
    out = df[df["status"] == "ok"] if "status" in df.columns else df
    return out[out["mode"].fillna("train") == "train"] if "mode" in out.columns else out


def _not_ok_lines(df: pd.DataFrame) -> list[str]:
    if "status" not in df.columns:
        return []
    bad = df[df["status"] != "ok"]
    if bad.empty:
        return []
    lines = ["", "Cells that did not run:", ""]
    reasons = bad.groupby(["status", bad["reason"].fillna("").str.slice(0, 110)], dropna=False).size()
    for (status, reason), n in reasons.items():
        lines.append(f"- {n} {status}: {cell(reason)}")
    return lines


def _reference(df: pd.DataFrame, keys: list[str]) -> dict:
    ref = df[(df["strategy"] == "single") & (df["world_size"] == 1)]
    return {tuple(r[k] for k in keys): r["step_time_median_s"] for _, r in ref.iterrows()}


def _noise(r: pd.Series) -> str:
    if present(r["stable"]) and bool(r["stable"]):
        return "stable"
    return cell(r.get("noise")) if present(r.get("noise")) and str(r.get("noise")) else "not stable"


def cells_view(ev: Evidence) -> View:
    df = _ok(ev.table)
    run_key = [c for c in ("experiment", "run_id") if c in df.columns and df[c].nunique() > 1][:1]
    keys = run_key + ["workload"]
    refs = _reference(df, keys)
    multi = {c: df[c].nunique() > 1 for c in ("workload", "backend")}
    header = [*(["run"] if run_key else []), *(["workload"] if multi["workload"] else []), "strategy",
              *(["backend"] if multi["backend"] else []), "GPUs", "median ms", "95% interval ms", "vs one device"]
    has_parity = "parity_ok" in df.columns
    header += ["parity"] if has_parity else []
    has_noise = "stable" in df.columns
    header += ["noise"] if has_noise else []
    rows = []
    order = [c for c in keys + ["world_size", "backend", "step_time_median_s"] if c in df.columns]
    for _, r in df.sort_values(order, kind="stable").iterrows():
        ref = refs.get(tuple(r[k] for k in keys))
        row = [cell(r[run_key[0]])] if run_key else []
        row += [cell(r["workload"])] if multi["workload"] else []
        row += [cell(r["strategy"])] + ([cell(r["backend"])] if multi["backend"] else [])
        row += [str(int(r["world_size"])), ms(r["step_time_median_s"]),
                interval(r["step_time_ci_low_s"], r["step_time_ci_high_s"]),
                f"{ref / r['step_time_median_s']:.2f}x" if present(ref) else "–"]
        row += [{True: "ok", False: "no"}.get(r["parity_ok"], "–") if present(r["parity_ok"]) else "–"] \
            if has_parity else []
        row += [_noise(r)] if has_noise else []
        rows.append(row)
    body = md_table(header, rows, group=bool(run_key)) + _not_ok_lines(ev.table)
    return View(_repeats_text(df), _ci_spread(df), body)


def strategy_check_view(ev: Evidence) -> View:
    df = ev.table.sort_values(["world_size", "strategy"], kind="stable")
    ok = df[df.status == "ok"]
    rows = [[cell(r.strategy), str(int(r.world_size)), num(r.param_share, "{:.3f}"),
             num(r.comm_calls_per_step, "{:.0f}")]
            for r in ok.itertuples()]
    body = md_table(["strategy", "GPUs", "share of parameters per rank", "collective calls per step"], rows)
    return View(_repeats_text(ok) + " (a check of each strategy, not a timing)", None, body + _not_ok_lines(df))


def defaults_view(ev: Evidence) -> View:
    df = ev.table
    rows = []
    for (strategy, ws), g in df.groupby(["strategy", "world_size"], sort=True):
        side = {r.defaults: r for r in g.itertuples()}
        new, old = side.get("new"), side.get("old")
        if new is None or old is None:
            continue
        rows.append([cell(strategy), str(int(ws)), ms(new.step_time_median_s), _spread_list(new.repeat_medians_s),
                     ms(old.step_time_median_s), _spread_list(old.repeat_medians_s),
                     f"{new.step_time_median_s / old.step_time_median_s:.3f}"])
    header = ["strategy", "GPUs", "new ms", "new: each repeat ms", "old ms", "old: each repeat ms", "new / old"]
    return View(_repeats_text(df) + ", new and old interleaved", _ci_spread(df), md_table(header, rows))


def floats(values) -> list[float]:
    """A list column (stored as a list or as its JSON text) as floats."""
    if not present(values):
        return []
    return [float(v) for v in (json.loads(values) if isinstance(values, str) else values)]


def _spread_list(values) -> str:
    return ", ".join(ms(v) for v in floats(values)) or "–"


def budget_view(ev: Evidence) -> View:
    df = ev.table
    rows = []
    for s in ev.sources:
        g = df[df.run_id == s["run_id"]]
        counts = g.status.value_counts()
        took = pd.Timestamp(s["updated_utc"]) - pd.Timestamp(s["created_utc"])
        rows.append([cell(s.get("experiment")), (s.get("date") or s["created_utc"][:10]), cell(s.get("status")),
                     f"{int(took.total_seconds())} s", str(int(counts.get("ok", 0))),
                     str(int(counts.get("skipped", 0))), str(int(counts.get("failed", 0)))])
    header = ["run", "date", "ended", "wall time (folder written to last update)", "ok", "skipped", "failed"]
    lines = md_table(header, rows) + ["", "Each run's plan, and what it printed about its budget at the end:", ""]
    for s in ev.sources:
        plan = s.get("plan") or ""
        said = [plan] + [t for t in s.get("terminal_budget_lines", []) if not plan.startswith(t)]
        lines += [f"- {cell(s.get('experiment'))}: " + "; ".join(f"`{t}`" for t in said if t)]
    return View(_repeats_text(_ok(df)), _ci_spread(_ok(df)), lines)


def _paired_rounds(records: list[dict]) -> list[tuple[float, float]]:
    """(harness, plain) median step of each round both sides finished."""
    sides: dict[str, dict] = {"harness": {}, "plain": {}}
    for r in records:
        if present(r["ok"]) and bool(r["ok"]) and r["side"] in sides and present(r["median_s"]):
            sides[r["side"]].setdefault(r["round"], r["median_s"])
    return [(h, sides["plain"][k]) for k, h in sorted(sides["harness"].items()) if k in sides["plain"]]


def _median(values) -> float:
    return float(pd.Series(list(values), dtype=float).median())


def harness_view(ev: Evidence) -> View:
    records = ev.table[["experiment", "family", "world_size", "side", "round", "ok", "median_s"]].to_dict("records")
    order = {e: i for i, e in enumerate(_distinct(s.get("experiment") for s in ev.sources))}
    groups: dict[tuple, list[dict]] = {}
    for r in records:
        groups.setdefault((r["experiment"], r["family"], int(r["world_size"])), []).append(r)
    rows, spreads = [], []
    for (exp, fam, ws), recs in sorted(groups.items(), key=lambda kv: (order.get(kv[0][0], 99), kv[0][2], kv[0][1])):
        pr = _paired_rounds(recs)
        if not pr:
            continue
        ratio = [h / p for h, p in pr]
        plain = [p for _, p in pr]
        spread = max(plain) / min(plain) - 1
        many = len(pr) > 1
        if many:
            spreads.append(spread)
        rows.append([cell(exp), cell(fam), str(ws), str(len(pr)), ms(_median(h for h, _ in pr)), ms(_median(plain)),
                     f"{_median(ratio):.3f}", f"{min(ratio):.3f}-{max(ratio):.3f}" if many else "–",
                     pct(spread, 0) if many else "–", f"{sum(x > 1 for x in ratio)}/{len(pr)}"])
    header = ["experiment", "family", "world size", "rounds", "harness ms", "plain ms", "median ratio",
              "ratio range", "plain spread", "harness slower"]
    spread = (f"the plain loop's round medians moved by a median of {pct(_median(spreads), 0)} "
              f"within a comparison of two or more rounds (max / min - 1; largest {pct(max(spreads), 0)})") \
        if spreads else None
    reps = "rounds per comparison as listed; a round runs the harness and the plain loop once each, alternating"
    return View(reps, spread, md_table(header, rows, fold=False, group=True))


def plain_loops_view(ev: Evidence) -> View:
    rows = [[cell(r.baseline), cell(r.backend), str(int(r.world_size)),
             num(r.omp_num_threads, "{:.0f}") if present(r.omp_num_threads) else "unset", ms(r.step_time_mean_s),
             num(r.loss_final, "{:.6f}")] for r in ev.table.itertuples()]
    header = ["loop", "backend", "GPUs", "OMP_NUM_THREADS", "mean step ms", "final loss"]
    return View("one run per row, mean over 20 timed steps", None, md_table(header, rows))


def gate_runs_view(ev: Evidence) -> View:
    df = ev.table
    rows, spreads = [], []
    for r in df.itertuples():
        reps = pd.Series(floats(r.repeat_medians_s), dtype=float)
        sp = (reps.max() - reps.min()) / reps.median() if len(reps) else None
        if sp is not None:
            spreads.append(sp)
        rows.append([cell(r.experiment), cell(r.gate_run), cell(r.strategy), str(int(r.world_size)),
                     ms(r.step_time_median_s), interval(r.step_time_ci_low_s, r.step_time_ci_high_s), pct(sp)])
    header = ["experiment", "run", "strategy", "GPUs", "median ms", "95% interval ms", "repeat spread"]
    body = md_table(header, rows, group=True)
    spread = (f"repeat spread (max - min of the repeat medians, over their median): median "
              f"{pct(pd.Series(spreads).median())}, largest {pct(max(spreads))}") if spreads else None
    return View(_repeats_text(df), spread, body)


def gate_verdicts_view(ev: Evidence) -> View:
    df = ev.table.copy()
    df["verdict"] = df["verdict"].map(cell)
    counts = df.groupby(["experiment", "pair", "verdict"], sort=False).size().unstack(fill_value=0)
    verdicts = list(counts.columns)
    rows = [[cell(e), cell(p), *[str(int(counts.loc[(e, p), v])) for v in verdicts]] for e, p in counts.index]
    lines = ["Verdicts per gate call and pair:", "", *md_table(["experiment", "pair", *verdicts], rows, group=True), ""]
    ddp = df[df.cell.str.contains("/ddp/") & df.cell.str.endswith("ws2")]
    cols = ["experiment", "pair", "verdict", "step time base → current", "shift [interval]", "noise floor"]
    detail = [[cell(r[c]) for c in cols] for r in ddp.to_dict("records")]
    lines += ["DDP at 2 GPUs, the cell that B slows by 5%:", "", *md_table(cols, detail, group=True)]
    return View("each verdict compares two runs; the gate's runs above hold 5 repeats per cell", None, lines)


def step_times_view(ev: Evidence) -> View:
    df = ev.table
    rows = []
    for run, g in df.groupby("run", sort=False):
        per = g.groupby("cell_id").step_time_s
        cv = (per.std() / per.mean()).dropna()
        tail = (per.quantile(0.95) / per.median()).dropna()
        rows.append([cell(run), str(per.ngroups), str(int(per.size().median())), pct(cv.median()), pct(cv.max()),
                     f"{tail.median():.3f}"])
    header = ["run", "cells", "steps a cell (median)", "step-time cv (median cell)", "cv (largest)",
              "p95 / median (median cell)"]
    return View("one run per cell", None, md_table(header, rows))


def sampler_view(ev: Evidence) -> View:
    df = ev.table.sort_values(["order", "world_size"], kind="stable")
    rows = [[str(int(r.order)), str(int(r.sample_hz)) if r.sample_hz else "off", cell(r.strategy),
             str(int(r.world_size)),
             ms(r.step_time_median_s), interval(r.step_time_ci_low_s, r.step_time_ci_high_s)] for r in df.itertuples()]
    header = ["order", "sampler Hz", "strategy", "GPUs", "median ms", "95% interval ms"]
    return View(_repeats_text(df) + "; the four runs in the order listed", _ci_spread(df), md_table(header, rows))


def two_agents_view(ev: Evidence) -> View:
    cols = ["experiment", "strategy", "world_size", "side", "status", "mode", "step_time_median_s",
            "step_time_ci_low_s", "step_time_ci_high_s", "nccl_between_agents", "repeats_done", "steps"]
    df = _ok(ev.table[cols])
    rows = []
    for (exp, strat, ws), g in df.groupby(["experiment", "strategy", "world_size"], sort=False):
        one = g[g.side == "one agent"].step_time_median_s
        two = g[g.side == "two agents"].step_time_median_s
        if one.empty or two.empty:
            continue
        links = _distinct(g.nccl_between_agents)
        rows.append([cell(exp), cell(strat), str(int(ws)), str(len(one)), ms(one.median()), str(len(two)),
                     ms(two.median()), f"{two.median() / one.median():.3f}", ", ".join(links) or "–"])
    header = ["experiment", "strategy", "GPUs", "one-agent runs", "one agent ms", "two-agent runs", "two agents ms",
              "two / one", "NCCL channels between agents"]
    return View(_repeats_text(df) + "; medians over the runs of each side", _ci_spread(df),
                md_table(header, rows, group=True))


def sweep_view(ev: Evidence) -> View:
    t = ev.table
    df = t[(t.kind == "sweep") & ~t.graph.fillna(False).astype(bool) & (t.status == "ok")]
    rows = []
    for (op, ws, dtype), g in df.groupby(["op", "world_size", "dtype"], sort=True):
        small, big = g.loc[g.bytes.idxmin()], g.loc[g.bytes.idxmax()]
        rows.append([cell(op), str(int(ws)), cell(dtype), _bytes(small.bytes), f"{small.time_s * 1e6:.1f}",
                     _bytes(big.bytes), f"{big.busbw_gbs:.1f}", num(big.vs_reference, "{:.3f}")])
    wrong = int(ev.table.wrong.fillna(0).sum())
    header = ["op", "GPUs", "dtype", "smallest size", "time there (µs)", "largest size", "busbw there (GB/s)",
              "vs reference"]
    body = md_table(header, rows, fold=False) + ["", f"Elements that came back wrong, over every point: {wrong}."]
    cfg = next((s.get("config") for s in ev.sources if s.get("config")), {}) or {}
    reps = (f"one sweep; {cfg.get('iters', '?')} timed iterations a point "
            f"(more while under {cfg.get('budget_s', '?')} s)")
    return View(reps, None, body)


def model_view(ev: Evidence) -> View:
    df = ev.table.sort_values(["backend", "op", "world_size", "lo"], kind="stable")
    rows = [[cell(r.op), cell(r.backend), str(int(r.world_size)), _bytes(r.lo) + " - " + _bytes(r.hi),
             f"{r.alpha_s * 1e6:.1f}", _gbs(r.busbw_gbs), pct(r.rel_rms, 0), str(int(r.points))]
            for r in df.itertuples()]
    header = ["op", "backend", "GPUs", "sizes", "alpha (µs)", "busbw (GB/s)", "rms error", "points"]
    return View("fits of one sweep", None, md_table(header, rows))


def _gbs(x: float) -> str:
    return "∞" if x == float("inf") else f"{x:.1f}"


def _bytes(b) -> str:
    if b == float("inf"):
        return "∞"
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if b >= size:
            return f"{b / size:g} {unit}"
    return f"{b:g} B"


def recorded_calls_view(ev: Evidence) -> View:
    rows = [[str(int(r.cell_id)), str(int(r.n)), cell(r.op_norm), str(int(r.calls)), f"{r.busbw_gbs:.1f}",
             f"{r.curve_gbs:.1f}", f"{r.ratio:.2f}", pct(r.below, 0)] for r in ev.table.itertuples()]
    header = ["cell", "GPUs", "op", "calls", "recorded busbw (GB/s)", "sweep curve (GB/s)", "recorded / curve",
              "calls below the curve"]
    return View("the calls of one run, each against the sweep's curve at its size", None, md_table(header, rows))


def serve_view(ev: Evidence) -> View:
    df = ev.table
    rows = []
    for r in df.itertuples():
        if r.status != "ok":
            continue
        rows.append([cell(r.experiment), cell(r.serve_task), cell(r.strategy), str(int(r.world_size)),
                     cell(r.serve_policy), cell(r.serve_load), num(r.serve_achieved_rps, "{:.1f}"),
                     ms(r.latency_p50_s), ms(r.latency_p99_s), num(r.latency_n, "{:.0f}"),
                     {True: "yes", False: "no"}.get(r.slo_met, "–") if present(r.slo_met) else "–"])
    header = ["experiment", "task", "placement", "GPUs", "policy", "load", "req/s done", "p50 ms", "p99 ms",
              "requests", "p99 target met"]
    body = md_table(header, rows, group=True) + _not_ok_lines(df)
    return View("one run per cell; latency percentiles over the cell's requests", None, body)


def printed_view(ev: Evidence) -> View:
    df = ev.table.drop(columns=[c for c in ("table",) if c in ev.table.columns])
    rows = [[cell(v) for v in r] for r in df.itertuples(index=False)]
    return View("one run per cell; the table as the run printed it", None, md_table(list(df.columns), rows))


def launch_cost_view(ev: Evidence) -> View:
    rows = [[cell(r.phase), f"{r.us_per_launch_median:.2f}", f"[{r.us_per_launch_min:.2f}, {r.us_per_launch_max:.2f}]",
             f"{r.added_us:+.2f}"] for r in ev.table.itertuples()]
    return View("5 interleaved blocks of 20,000 launches a phase", None,
                md_table(["phase", "us a launch, median", "[min, max] over blocks", "added us"], rows, fold=False))


def step_cost_view(ev: Evidence) -> View:
    rows = [[cell("yes" if r.reshard_after_forward else "no"), cell(r.phase), f"{r.median_ms:.1f}",
             f"[{r.min_ms:.1f}, {r.max_ms:.1f}]", f"{r.vs_plain:.3f}", cell(r.block_medians_ms)]
            for r in ev.table.itertuples()]
    header = ["resharded after forward", "phase", "ms a step, median of blocks", "[min, max] over blocks",
              "vs plain", "each block's median, in round order"]
    return View("5 interleaved rounds of a 10-step block a phase", None, md_table(header, rows, fold=False))


def passes_view(ev: Evidence) -> View:
    rows = [[cell(r.run_id), f"{int(r.passes_at_most)} / {int(r.builds_at_most)}", cell(r.backend),
             str(int(r.world_size)), cell(r.strategy), f"{r.timed_ms:.1f}", pct(r.timed_cv, 1),
             f"{r.unprofiled_ms:.1f}", f"{r.profiled_ms:.1f}", pct(r.breakdown_gap, 1),
             f"{int(r.profile_passes)} / {int(r.profile_builds)}"]
            for r in ev.table.itertuples()]
    header = ["run", "passes a build / builds, at most", "backend", "GPUs", "strategy", "timed median ms", "timed cv",
              "the kept build's unprofiled steps, ms", "profiled ms (kept pass)", "profiled / timed - 1",
              "passes / builds run"]
    return View("one run per cell (its adaptive repeats included)", None, md_table(header, rows, fold=False))


def projection_view(ev: Evidence) -> View:
    df = ev.table
    rows = [[cell(r.strategy), str(int(r.world_size)), str(int(r.nodes)), ms(r.pred_step_s),
             ms(r.pred_step_calibrated_s),
             ms(r.measured_step_s), pct(r.err, 0), pct(r.err_calibrated, 0),
             num(r.inter_node_gbs, "{:.0f}")] for r in df.itertuples()]
    header = ["strategy", "GPUs", "nodes", "estimate ms", "calibrated estimate ms", "measured ms", "error",
              "calibrated error", "assumed inter-node GB/s"]
    return View("estimates from the one-run cells of one run", None, md_table(header, rows, fold=False))


def fixed_projection_view(ev: Evidence) -> View:
    df = ev.table
    rows = [[cell(r.strategy), str(int(r.world_size)), cell(r.variant_fixed),
             f"{ms(r.pred_fixed_ms / 1e3)} [{ms(r.pred_fixed_lo_ms / 1e3)}, {ms(r.pred_fixed_hi_ms / 1e3)}]",
             f"{ms(r.measured_ms / 1e3)} [{ms(r.measured_lo_ms / 1e3)}, {ms(r.measured_hi_ms / 1e3)}]",
             f"{r.err_median_pct:+.1f}% [{r.err_min_pct:+.1f}%, {r.err_max_pct:+.1f}%]", str(int(r.repeats))]
            for r in df.itertuples()]
    header = ["strategy", "GPUs", "variant (fixed from 2 GPUs)", "estimate ms [from each 2-GPU repeat]",
              "measured ms [min, max over repeats]", "error: median [min, max] over repeats", "repeats"]
    return View("estimates from 1- and 2-GPU cells with 5 repeats, checked against 5 repeats at 4 GPUs", None,
                md_table(header, rows, fold=False))


def breakdown_view(ev: Evidence) -> View:
    """Each cell's profiled step (the steps its breakdown comes from) against its timed median, and
    the pipelines' bubble against the textbook and the stage model."""
    df = _ok(ev.table)
    labels = {"bubble_theory": "bubble: textbook", "bubble_stages": "stage model", "bubble_measured": "measured",
              "pipeline_gap": "step vs stage model"}
    pipe = [c for c in labels if c in df.columns]
    runs = "experiment" in df.columns
    backends = "backend" in df.columns and df["backend"].nunique() > 1
    header = [*(["run"] if runs else []), "workload", "strategy", *(["backend"] if backends else []), "GPUs",
              "timed ms", "profiled ms", "profiled / timed - 1", *(labels[c] for c in pipe)]
    order = [c for c in ("experiment", "workload", "backend", "world_size", "strategy") if c in df.columns]
    rows = []
    for _, r in df.sort_values(order, kind="stable").iterrows():
        row = [cell(r["experiment"])] if runs else []
        row += [cell(str(r["workload"]).split("(")[0]), cell(r["strategy"])]
        row += [cell(r["backend"])] if backends else []
        row += [str(int(r["world_size"])), ms(r["step_time_median_s"]), ms(r.get("profiled_step_s")),
                pct(r["breakdown_gap"]) if present(r.get("breakdown_gap")) else "–"]
        row += [pct(r[c], 0) if present(r[c]) else "–" for c in pipe]
        rows.append(row)
    gaps = df["breakdown_gap"] if "breakdown_gap" in df.columns else pd.Series(float("nan"), index=df.index)
    off = gaps.abs() > BREAKDOWN_GAP_MAX
    tail = ["", f"{int(off.sum())} of {int(df['breakdown_gap'].notna().sum())} profiled cells are more than "
            f"{BREAKDOWN_GAP_MAX:.0%} off "
            "their timed median; the report draws their breakdown with that warning and leaves it out of the "
            "recommendation's reasons."] if "breakdown_gap" in df.columns else []
    return View(_repeats_text(df) + "; 2 profiled steps a cell", None,
                md_table(header, rows, group=runs) + tail)


def cells_and_breakdown_view(ev: Evidence) -> View:
    cells, bd = cells_view(ev), breakdown_view(ev)
    return View(bd.repeats, cells.spread, cells.body + ["", "Profiled steps and pipeline bubbles:", ""] + bd.body)


def kernel_view(ev: Evidence) -> View:
    df = ev.table
    kinds = df[df.launches_per_step.notna()]
    facts = df[df.launches_per_step.isna()]
    cells = list(dict.fromkeys(df["cell"]))
    rows = []
    for kind in dict.fromkeys(kinds.sort_values("ms_per_step", ascending=False, kind="stable")["kind"]):
        got = kinds[kinds.kind == kind].set_index("cell")
        rows.append([kind] + [f"{got.loc[c, 'ms_per_step']:.2f} ({got.loc[c, 'launches_per_step']:.0f})"
                              if c in got.index else "–" for c in cells])
    for fact in dict.fromkeys(facts["kind"]):
        got = facts[facts.kind == fact].set_index("cell")
        rows.append([fact] + [f"{got.loc[c, 'ms_per_step']:.2f}" if c in got.index else "–" for c in cells])
    return View("one cell each, its 2 profiled steps", None,
                md_table(["kind of kernel: ms a step (launches)", *cells], rows, fold=False))


def default_run_view(ev: Evidence) -> View:
    body = printed_view(ev).body + ["", "Run end:", "", *[f"- {line}" for line in ev.meta.get("run_end", [])],
                                    "", "First screen:", "", "```text", ev.meta.get("first_screen", ""), "```"]
    return View("one run; the reference and three candidates measured 3 times, the other cells once", None, body)


def default_cells_view(ev: Evidence) -> View:
    """A default run kept as its cells table: its first screen and end, every cell, the breakdown check."""
    cells, bd = cells_view(ev), breakdown_view(ev)
    body = ["First screen (the run's last lines on the terminal):", "", "```text", ev.meta.get("first_screen", ""),
            "```", "", "Run end:", "", *[f"- {line}" for line in ev.meta.get("run_end", [])], "", "Every cell:", "",
            *cells.body, "", "Profiled steps against timed steps:", "", *bd.body]
    return View(cells.repeats, cells.spread, body)


def profile_steps_view(ev: Evidence) -> View:
    df = ev.table
    rows = [[cell(r.strategy), str(int(r.world_size)), str(int(r.repeats)), f"{r.timed_ms:.1f}", pct(r.timed_cv, 1),
             str(int(r.profile_steps)), f"{r.profiled_ms:.1f}", pct(r.breakdown_gap), cell(r.rank0_step_to_step_ms)]
            for r in df.itertuples()]
    header = ["strategy", "GPUs", "repeats", "timed median ms", "timed cv", "profiled steps", "profiled ms",
              "profiled / timed - 1", "rank 0, loss kernel to loss kernel (ms)"]
    return View("2 repeats a cell, 8 profiled steps", None, md_table(header, rows, fold=False))


def settled_view(ev: Evidence) -> View:
    rows = [[cell(r.strategy), str(int(r.world_size)), str(int(r.repeats)), f"{r.timed_ms:.1f}", pct(r.timed_cv, 1),
             f"{r.unprofiled_ms:.1f}", f"{r.profiled_ms:.1f}", pct(r.breakdown_gap, 1), pct(r.idle_frac, 1)]
            for r in ev.table.itertuples()]
    header = ["strategy", "GPUs", "repeats", "timed median ms", "timed cv", "the pass's unprofiled steps, ms",
              "profiled ms (mean of ranks)", "slowest rank's profiled / timed - 1", "idle in the profiled step"]
    return View("2 repeats a cell, 2 unprofiled then 2 profiled steps", None, md_table(header, rows, fold=False))


def beyond_view(ev: Evidence) -> View:
    rows = []
    for r in ev.table.itertuples():
        ok = r.status == "ok"
        rows.append([cell(r.strategy), str(int(r.world_size)), cell(r.status),
                     ms(r.step_time_median_s) if ok else "–",
                     f"[{ms(r.step_time_ci_low_s)}, {ms(r.step_time_ci_high_s)}]" if ok else "–",
                     f"{r.peak_mem_bytes / 2**30:.1f}" if ok else "–", pct(r.breakdown_gap, 1) if ok else "–",
                     "" if ok else cell(str(r.reason).split(";")[0])])
    header = ["strategy", "GPUs", "status", "ms/step", "95% interval", "peak GiB", "profiled / timed - 1",
              "why not run"]
    return View("2 repeats of 10 steps a cell", None, md_table(header, rows, fold=False))


def marker_windows_view(ev: Evidence) -> View:
    rows = [[cell(r.strategy), str(int(r.world_size)), f"{r.timed_ms:.1f}", f"{r.profiled_ms_between_markers:.1f}",
             pct(r.breakdown_gap), pct(r.idle_frac), f"{r.profiled_ms_first_to_last_kernel:.1f}"]
            for r in ev.table.itertuples()]
    header = ["strategy", "GPUs", "timed median ms", "profiled ms, between markers", "profiled / timed - 1",
              "idle in the profiled step", "first to last kernel, ms"]
    return View("2 repeats a cell, 2 profiled steps", None, md_table(header, rows, fold=False))


def knob_memory_view(ev: Evidence) -> View:
    rows = [[str(int(r.global_batch)), cell(r.optimizer), cell(r.compile), cell(r.ac), ms(r.step_time_median_s),
             f"[{ms(r.step_time_ci_low_s)}, {ms(r.step_time_ci_high_s)}]", f"{r.peak_mem_bytes / 2**30:.2f}",
             num(r.compile_s, "{:.1f}") if present(r.compile_s) else "–"] for r in ev.table.itertuples()]
    header = ["global batch", "optimizer", "compile", "checkpointing", "ms/step", "95% interval", "peak GiB",
              "compile s"]
    return View("one run, 10 timed steps a cell", None, md_table(header, rows, fold=False))


def memory_model_view(ev: Evidence) -> View:
    def pct(x) -> str:
        return f"{x:+.1%}" if present(x) else "–"

    rows = [[cell(r.workload), f"{r.params_b:.2f}B", cell(r.optimizer), cell(r.ac), str(int(r.global_batch)),
             f"{r.pred_gib:.2f}", f"{r.measured_gib:.2f}", pct(r.err), f"{r.pred_reserved_gib:.2f}",
             f"{r.reserved_gib:.2f}", pct(r.reserved_err), f"{r.pred_process_gib:.2f}", f"{r.nvml_process_gib:.2f}",
             pct(r.process_err)] for r in ev.table.itertuples()]
    header = ["workload", "params", "optimizer", "checkpointing", "global batch", "predicted GiB", "allocated GiB",
              "error", "pred. reserved", "reserved GiB", "error", "pred. process", "NVML GiB", "error"]
    return View("one run a cell, 3 timed steps after 2 warm-up; errors are predicted / measured - 1", None,
                md_table(header, rows, fold=True))


def knob_parity_view(ev: Evidence) -> View:
    df = ev.table
    rows = []
    for (exp, wl), g in df.groupby(["experiment", "workload"], sort=False):
        ok = g[g["status"] == "ok"]
        rows.append([cell(exp), cell(wl), str(len(g)), str(len(ok)), str(int((g["status"] == "skipped").sum())),
                     str(int((g["status"] == "failed").sum())), str(int(ok["parity_ok"].astype(bool).sum())),
                     f"{ok['parity_rel_err'].max():.1e}" if len(ok) else "–"])
    header = ["experiment", "workload", "cells", "ran", "skipped (reason given)", "failed", "parity ok",
              "largest parity error"]
    return View("one run per experiment; 3 timed steps after 1 warm-up a cell (adaptive up to 13), or 25 fixed", None,
                md_table(header, rows, fold=False))


def parity_rounding_view(ev: Evidence) -> View:
    """Per workload and optimizer: how far the cells' parity errors sit from their reference's rounding."""
    rows = []
    for (wl, opt), g in ev.table.groupby(["workload", "optimizer"], sort=True):
        rows.append([cell(wl), cell(opt), str(len(g)), f"{g['parity_rounding'].iloc[0]:.1e}",
                     f"{g['parity_rel_err'].max():.1e}", f"{g['ratio'].min():.3g}-{g['ratio'].max():.3g}",
                     f"{g['parity_tol'].max():.1e}", f"{int(g['parity_ok'].astype(bool).sum())} of {len(g)}"])
    header = ["workload", "optimizer", "cells", "reference's rounding", "largest error", "error / rounding",
              "tolerance", "parity ok"]
    return View("one run; 25 steps a cell, world sizes 2 and 4", None, md_table(header, rows, fold=False))


def search_view(ev: Evidence) -> View:
    """The knob search's cells or its grid: each configuration's step, interval and samples a second."""
    df = ev.table.sort_values("throughput_samples_s", ascending=False)
    rows = []
    for r in df.itertuples():
        mark = [m for m, on in (("answer", getattr(r, "answer", False)), ("grid's fastest",
                                                                          getattr(r, "grid_fastest", False))) if on]
        rows.append([cell(str(getattr(r, "search_stage", getattr(r, "grid_run", "")))), cell(r.compile), cell(r.ac),
                     str(int(r.global_batch)), str(int(r.repeats_done)), f"{r.step_time_median_s * 1e3:.1f}",
                     f"[{r.step_time_ci_low_s * 1e3:.1f}, {r.step_time_ci_high_s * 1e3:.1f}]",
                     f"{r.throughput_samples_s:.1f}", f"{r.peak_mem_bytes / 2**30:.1f}", ", ".join(mark) or "–"])
    header = ["stage" if "search_stage" in df else "grid run", "compile", "checkpointing", "global batch", "repeats",
              "median step (ms)", "95% interval (ms)", "samples/s", "peak GiB", ""]
    reps = _range(df["repeats_done"])
    return View(f"{reps} repeats a cell as the search or the grid gave them; timed steps as the budget capped "
                "them (the grid: 5 a repeat)", None,
                md_table(header, rows, fold=False))


def search_aa_view(ev: Evidence) -> View:
    """The search's answers of two runs in a row, slot by slot."""
    rows = [[cell(r.pair), str(int(r.run)), cell(r.slot), cell(r.answer), f"{r.samples_s:.1f}", str(int(r.repeats)),
             f"{r.vs_defaults:.2f}x" if present(r.vs_defaults) else "–", cell(r.vs_defaults_verdict),
             cell(r.runner_up_verdict), "yes" if r.decided else "no"] for r in ev.table.itertuples()]
    header = ["pair", "run", "slot", "answer", "samples/s", "repeats", "vs defaults", "verdict",
              "runner-up verdict", "decided"]
    return View("two runs of the default CPU matrix in a row per pair; repeats as the search gave them", None,
                md_table(header, rows, fold=True))


def cpu_default_view(ev: Evidence) -> View:
    rows = [[str(int(r.run)), f"{r.wall_s:.0f}", cell(r.workload) + (" (launch-bound)" if r.launch_bound else ""),
             f"{r.backend} x{int(r.world_size)}", cell(r.use), cell(r.decided), cell(r.fastest),
             f"{r.speedup:.2f}x" if present(r.speedup) else "–"] for r in ev.table.itertuples()]
    header = ["run", "seconds", "workload", "where", "use", "decided?", "fastest candidate", "vs one device"]
    return View("two runs of the default matrix in a row; repeats as its 4-minute budget planned them", None,
                md_table(header, rows, fold=False))


def generic_view(ev: Evidence) -> View:
    if {"strategy", "world_size", "step_time_median_s", "status"} <= set(ev.table.columns):
        return cells_view(ev)
    return printed_view(ev)


# ------------------------------------------------------------------------------------------ the page


@dataclass
class Part:
    name: str
    title: str
    view: Callable[[Evidence], View]


@dataclass
class Section:
    title: str
    intro: str
    parts: list[Part]


TRAINING = "Training step time per strategy"
SECTIONS = [
    Section(TRAINING, "Each cell trains one workload under one strategy at one GPU count, with the same global batch "
            "as the one-device cell. *vs one device* is the one-device median divided by the cell's median: above "
            "1.00 the cell's step is faster than one device's.",
            [Part("all-strategies-h100-x2", "Every strategy at 1 and 2 GPUs, NCCL and Gloo", cells_view),
             Part("all-strategies-h100-x4", "2 and 4 GPUs, NCCL", cells_view)]),
    Section("Strategy checks", "Whether each strategy distributes its work: the share of the model's parameters each "
            "rank holds and the collective calls a step makes.",
            [Part("strategy-check-h100-x4", "Every strategy at 2 and 4 GPUs", strategy_check_view)]),
    Section("Best-practice defaults against the old defaults", "The same cells under two sets of strategy "
            "defaults: *new*, the defaults of the version measured (FSDP2 in bf16 mixed precision, pipeline stages "
            "balanced by measured time, the sequence-parallel tensor plan), and *old*, the options the second "
            "command sets (`fsdp_mp=off`, `pp_balance=params`, `tp_plan=megatron`). Tensor parallel now defaults "
            "to the Megatron plan.",
            [Part("defaults-new-vs-old-h100-x4", "FSDP, 1F1B and tensor parallel at 4 GPUs", defaults_view)]),
    Section("The default matrix under its default budget", "`parbench run` with no options. The H200 runs are of "
            "the default matrix as it is; the H100 runs are of earlier ones, with gpt-200m alone.",
            [Part("default-run-h200-x4", "The default GPU run on 4 H200s, twice, with a model beyond one GPU",
                  default_cells_view),
             Part("default-run-h200-x2", "The default GPU run on 2 H200s, with a model beyond one GPU",
                  default_cells_view),
             Part("cpu-default-2core", "The default CPU run on 2 cores, twice", cpu_default_view),
             Part("breakdown-settled-h200-x2", "Profiled steps after the pass settles, 2 GPUs", settled_view),
             Part("breakdown-markers-h200-x2", "Profiled steps between their markers, 2 GPUs", marker_windows_view),
             Part("profiler-launch-cost-h200", "What recording GPU activity costs a launch", launch_cost_view),
             Part("profiler-step-cost-fsdp-h200-x4", "What recording GPU activity does to an FSDP2 step, 4 GPUs",
                  step_cost_view),
             Part("profile-passes-h200-x4", "Profile passes run again until the step matches, 4 GPUs", passes_view),
             Part("fsdp-profile-steps-h200-x4", "FSDP's profiled steps, 8 a cell", profile_steps_view),
             Part("default-run-gb64-h100-x4", "The default GPU run at global batch 64, 8-minute budget",
                  default_run_view),
             Part("default-matrix-budget-h100-x4", "Three runs of an earlier default matrix", budget_view)]),
    Section("A model no single GPU holds", "`parbench run --config configs/beyond-one-device.toml`: the strategies "
            "that cut the model build it on the meta device and allocate their part on each GPU.",
            [Part("beyond-one-device-h200-x2", "gpt-20b on 2 H200s", beyond_view)]),
    Section("gpt-200m against a nanoGPT-style GPT", "The built-in gpt-200m and a GPT written as nanoGPT writes "
            "it, of the same size, under the same strategies in the same call; before and after gpt-200m took "
            "a fused q/k/v projection without biases, as nanoGPT has.",
            [Part("gpt200m-vs-nanogpt-h100-x4", "Step times; profiled steps against timed steps; pipeline bubbles",
                  cells_and_breakdown_view),
             Part("gpt200m-kernels-h100-x4", "GPU time by kind of kernel", kernel_view)]),
    Section("Harness against plain PyTorch loops", "The same configuration run by parbench (*harness*) and by a plain "
            "PyTorch loop (`tools/baselines/`), alternating on the same GPUs. *harness ms* and *plain ms* are medians "
            "over the rounds of each side's median step. A round's ratio is the harness median over the plain "
            "median: above 1 the harness step was slower. *plain spread* is how far the plain loop's own rounds "
            "moved.",
            [Part("knobs-compile-h200", "One H200: AdamW, eager and compiled", harness_view),
             Part("harness-vs-plain-h100", "On H100 GPUs", harness_view),
             Part("harness-vs-plain-cpu", "On CPU", harness_view),
             Part("harness-vs-plain-gpipe-h200-x4", "GPipe's default stages on 4 H200 GPUs", harness_view),
             Part("harness-vs-plain-gpipe-h200-x2", "GPipe's default stages on 2 H200 GPUs", harness_view),
             Part("plain-loops-h100-x2", "Plain loops at 2 GPUs", plain_loops_view)]),
    Section("Training knobs", "The optimizer, torch.compile and activation checkpointing as knobs of every cell "
            "(docs/guides/training-knobs.md): what they cost and save on one GPU, and that every strategy runs and "
            "matches one device under them.",
            [Part("knobs-memory-h200", "Peak memory and step time on one H200, gpt-200m", knob_memory_view),
             Part("memory-model-h200", "The memory model's predicted peak against the measured one, one H200",
                  memory_model_view),
             Part("knobs-parity-cpu", "Every strategy under AdamW, compile and checkpointing on CPU (gloo)",
                  knob_parity_view),
             Part("parity-rounding-cpu", "Parity errors against the reference's own rounding on CPU (gloo)",
                  parity_rounding_view)]),
    Section("The knob search", "A budgeted run's search (docs/guides/search.md) over the batch per "
            "device, activation checkpointing and torch.compile: of the single-device reference on one H200 (gpt-200m, "
            "AdamW, bf16 autocast), with a grid over the same knobs measured apart, 3 repeats a cell; and of the "
            "default CPU matrix on 2 cores, twice in a row.",
            [Part("search-run-h200", "The search's cells, 5-minute budget", search_view),
             Part("search-grid-h200", "The search's answer against a grid over the same knobs", search_view),
             Part("search-cpu-aa", "The default CPU run's search, twice in a row, 2 cores", search_aa_view)]),
    Section("Regression gate", "Runs A1 and A2 have the same configuration; run B makes DDP 5% slower "
            "(`tests.regress_helpers:DDPSlowed`). `parbench compare` judged each pair of runs.",
            [Part("gate-runs-h100", "The gate's runs", gate_runs_view),
             Part("gate-verdicts-h100", "The verdicts", gate_verdicts_view),
             Part("step-times-h100", "Per-step times of the training runs", step_times_view)]),
    Section("Telemetry sampler overhead", "One DDP cell and its one-device reference with the sampler off, at 20 Hz, "
            "at 100 Hz and off again.",
            [Part("sampler-overhead-h100-x2", "DDP at 2 GPUs", sampler_view)]),
    Section("Two torchrun agents on one host against one", "The same cells launched by one torchrun agent and by two "
            "agents on one host (one per half of the GPUs, as two nodes would be).",
            [Part("two-agents-vs-one-h100", "DDP and FSDP", two_agents_view)]),
    Section("Collectives", "`parbench comm`: every NCCL collective from 1 KiB to 1 GiB, the fitted latency-bandwidth "
            "model, and the calls a training run made against the sweep's curve.",
            [Part("collective-sweep-h100-x4", "The sweep", sweep_view),
             Part("collective-model-h100-x4", "The model's fits", model_view),
             Part("recorded-calls-vs-curve-h100-x4", "Recorded calls against the curve", recorded_calls_view)]),
    Section("Serving", "`parbench serve`: gpt-small behind several placements and balancing policies, under Poisson "
            "or closed-loop load. Latencies are per request.",
            [Part("serve-score-h100-x4-first", "Scoring on 4 GPUs, pools not warmed", serve_view),
             Part("serve-score-h100-x2", "Scoring on 2 GPUs", serve_view),
             Part("serve-generate-h100-x2", "Generation on 2 GPUs", serve_view),
             Part("serve-generate-levels-h100-x2", "Generation levels on 2 GPUs", printed_view),
             Part("serve-h100-x4-warm", "Scoring and generation on 4 GPUs", serve_view),
             Part("serve-score-h100-x4-wire-padding", "Scoring on 4 GPUs, replicas and pipeline", printed_view),
             Part("serve-h100-x4-padded-shapes", "4 replicas with padded shapes warmed", printed_view),
             Part("serve-rate-vs-p99-h100-x4", "Rate against p99 on 4 replicas", serve_view),
             Part("serve-capacity-h200", "One replica's capacity and what limits it, 1 H200", printed_view)]),
]
ESTIMATES = Section("Estimates, not measurements", "These figures are computed by a model from measured cells; they "
                    "are estimates. Where a measured cell exists it stands beside the estimate.",
                    [Part("projection-fixed-gb64-h200-x4", "Step time projected from 1 and 2 GPUs at global batch 64, "
                          "the model fixed first", fixed_projection_view),
                     Part("projection-fixed-h100-x4", "Step time projected from 1 and 2 GPUs, the model fixed first",
                          fixed_projection_view),
                     Part("projection-h100-x4", "Step time projected from 1 and 2 GPUs, one run per cell",
                          projection_view)])
OTHER = "Other tables"


def sections() -> list[Section]:
    """The page's sections; a table no section names joins the training section (a cells table) or the last."""
    out = [Section(s.title, s.intro, list(s.parts)) for s in SECTIONS]
    named = {p.name for s in out + [ESTIMATES] for p in s.parts}
    other = Section(OTHER, "Tables without a section of their own.", [])
    for name in evidence_names():
        if name in named:
            continue
        cells = {"strategy", "world_size", "step_time_median_s"} <= set(load(name).table.columns)
        (out[0] if cells else other).parts.append(Part(name, name, generic_view))
    return out + ([other] if other.parts else []) + [ESTIMATES]


def render_part(part: Part) -> tuple[list[str], str]:
    ev = load(part.name)
    view = part.view(ev)
    lines = [f"### {part.title}", "", cell(ev.meta.get("summary") or ev.meta.get("what", "")) + ".", "",
             *provenance(ev, view.repeats, view.spread), "", *view.body, ""]
    return lines, view.repeats


def render_results() -> str:
    secs = [s for s in sections() if any(_table_path(p.name) for p in s.parts)]
    body: list[str] = []
    index = []
    for s in secs:
        body += [f"## {s.title}", "", s.intro, ""]
        for part in s.parts:
            if _table_path(part.name) is None:
                continue
            lines, repeats = render_part(part)
            body += lines
            ev = load(part.name)
            index.append([f"[{s.title}](#{slug(s.title)})", f"[{part.title}](#{slug(part.title)})",
                          hardware(ev).split(" (driver")[0], ", ".join(dates(ev)) or "–", repeats])
    head = [f"<!-- Generated by `{COMMAND}` from the tables in docs/evidence/; do not edit by hand. -->",
            "# Measured results", "",
            "What has been measured with parbench, on what hardware and software, and how sure each figure is. "
            "Every figure here is computed from a table in [evidence/](evidence/README.md); each part names its "
            "table, the runs behind it and the command that made them.", "",
            "How to read the figures:", "",
            "- Step times are medians in milliseconds; a step's time is the slowest rank's.",
            "- *95% interval* is the interval of that median: over its repeats' medians when a cell ran three or "
            "more times, else over its timed steps.",
            "- *one run per cell*: the cell was measured once, so its interval does not include the drift between "
            "runs. Compare such figures across runs with care.",
            "- The last section holds estimates, not measurements.", "",
            *md_table(["section", "result", "hardware", "date", "repeats"], index, fold=False, group=True), ""]
    return "\n".join(head + body).rstrip() + "\n"


# ------------------------------------------------------------------------------------ the README block


def parse_where(items: list[str]) -> dict[str, list[str]]:
    out = {}
    for item in items:
        key, sep, vals = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"results_page: --where wants COL=V[,V], got {item!r}")
        out[key] = vals.split(",")
    return out


def readme_rows(ev: Evidence, where: dict[str, list[str]]) -> tuple[pd.DataFrame, pd.Series | None]:
    """The README's rows of a cells table and the one-device reference row: one run, one workload, one backend."""
    df = ev.table
    for col, vals in where.items():
        if col not in df.columns:
            raise SystemExit(f"results_page: {ev.name} has no column {col!r}")
        df = df[df[col].astype(str).isin(vals)]
    df = _ok(df)
    if df.empty:
        raise SystemExit(f"results_page: no ok cell in {ev.name} for {where}")
    if "run_id" in df.columns and df.run_id.nunique() > 1:
        df = df[df.run_id == sorted(df.run_id.unique())[-1]]
    if df.workload.nunique() > 1:
        df = df[df.workload == df.sort_values("params", kind="stable").workload.iloc[-1]]
    ref = df[(df.strategy == "single") & (df.world_size == 1)]
    multi = df[df.world_size > 1]
    backends = sorted(multi.backend.unique())
    if len(backends) > 1:
        multi = multi[multi.backend == ("nccl" if "nccl" in backends else backends[0])]
    rows = pd.concat([ref, multi]).sort_values(["world_size", "step_time_median_s"], kind="stable")
    return rows, (ref.iloc[0] if len(ref) else None)


def _readme_source(ev: Evidence, rows: pd.DataFrame) -> dict:
    runs = set(rows.run_id) if "run_id" in rows.columns else set()
    return next((s for s in ev.sources if s.get("run_id") in runs), ev.sources[0] if ev.sources else {})


def _basis(rows: pd.DataFrame) -> str:
    basis = rows["ci_basis"].dropna().astype(str) if "ci_basis" in rows.columns else pd.Series(dtype=str)
    if len(basis) and basis.str.startswith("repeats").all():
        return "medians of the cell's repeats"
    return "cell's timed steps" if not len(basis) or basis.str.startswith("steps").all() else \
        "cell's timed steps, or its repeats' medians where it ran three or more times"


def said_for(screen: str, workload: str, backend: str, ws: int) -> str:
    """What a printed recommendation list says to do for one backend and world size, on one line
    ('' if it has no such pick): the pick's line and its continuations, not the fine print under it."""
    from reports.words import said

    return said(screen, workload, backend, ws)


def readme_block(name: str, where: dict[str, list[str]]) -> str:
    ev = load(name)
    rows, ref = readme_rows(ev, where)
    src = _readme_source(ev, rows)
    first = rows.iloc[0]
    params = f" ({first['params'] / 1e6:.1f}M parameters)" if present(first.get("params")) else ""
    workload = str(first["workload"]).split("(")[0]
    backend = ", ".join(sorted(rows[rows.world_size > 1].backend.unique()))
    date = src.get("date") or (src.get("created_utc") or "")[:10]
    lines = [f"Measured on {src.get('gpus', 'not recorded')} (driver {src.get('driver', '?')}), "
             f"torch {src.get('torch', '?')}, CUDA {src.get('cuda', '?')}, NCCL {src.get('nccl', '?')}, on {date}:",
             f"{workload}{params}, {first.get('precision', '?')}, global batch {int(first['global_batch'])}, "
             f"{backend}; **{_repeats_text(rows)}**. The interval is the 95% interval of the median over the "
             f"{_basis(rows)}.", ""]
    if ev.meta.get("readme_note"):
        lines += [ev.meta["readme_note"], ""]
    table = []
    varied = "repeats_done" in rows.columns and rows["repeats_done"].nunique() > 1
    for _, r in rows.iterrows():
        speed = f"{ref['step_time_median_s'] / r['step_time_median_s']:.2f}x" if ref is not None else "–"
        reps = [str(int(r["repeats_done"])) if present(r.get("repeats_done")) else "–"] if varied else []
        table.append([r["strategy"], str(int(r["world_size"])), *reps, ms(r["step_time_median_s"]),
                      interval(r["step_time_ci_low_s"], r["step_time_ci_high_s"]), speed])
    lines += md_table(["strategy", "GPUs", *(["repeats"] if varied else []), "median step (ms)", "95% interval (ms)",
                       "speedup vs one GPU"], table, fold=False)
    if ref is not None:
        multi = rows[rows.world_size > 1]
        slower = [f"{r.strategy} at {int(r.world_size)} GPUs ({ref['step_time_median_s'] / r.step_time_median_s:.2f}x)"
                  for r in multi.itertuples() if r.step_time_median_s >= ref["step_time_median_s"]]
        faster = [f"{r.strategy} at {int(r.world_size)} GPUs ({ref['step_time_median_s'] / r.step_time_median_s:.2f}x)"
                  for r in multi.itertuples() if r.step_time_median_s < ref["step_time_median_s"]]
        if multi.empty:
            pass
        elif not slower:
            lines += ["", "Every strategy shown steps faster than one GPU at this batch."]
        elif len(faster) <= len(slower):
            lines += ["", "Faster than one GPU at this batch: " + ("; ".join(faster) if faster else "none") + "."]
        else:
            lines += ["", "Slower than one GPU at this batch: " + "; ".join(slower) + "."]
    said = said_for(ev.meta.get("first_screen", ""), str(first["workload"]), backend, int(rows.world_size.max()))
    if said:
        lines += ["", f"The run's recommendation at {int(rows.world_size.max())} GPUs: *{said}*."]
    rel = ev.path.relative_to(ROOT).as_posix()
    lines += ["", f"![Median step time per strategy and GPU count, from {rel}]({FIGURE.relative_to(ROOT).as_posix()})",
              "", f"Command: `{command(src.get('command', 'not recorded'))}`. Table: [{rel}]({rel}); "
              f"every measured result: [docs/RESULTS.md](docs/RESULTS.md)."]
    return "\n".join(lines) + "\n"


def write_figure(name: str, where: dict[str, list[str]], path: Path = FIGURE) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ev = load(name)
    rows, ref = readme_rows(ev, where)
    multi = rows[rows.world_size > 1]
    strategies = list(dict.fromkeys(multi.sort_values("step_time_median_s", kind="stable").strategy))
    sizes = sorted(multi.world_size.unique())
    fig, ax = plt.subplots(figsize=(6.4, 3.2), dpi=100)
    width = 0.8 / max(len(sizes), 1)
    for i, ws in enumerate(sizes):
        sub = multi[multi.world_size == ws].set_index("strategy")
        xs = [k + (i - (len(sizes) - 1) / 2) * width for k, s in enumerate(strategies) if s in sub.index]
        got = [sub.loc[s] for s in strategies if s in sub.index]
        med = [g["step_time_median_s"] * 1e3 for g in got]
        err = [[m - g["step_time_ci_low_s"] * 1e3 for m, g in zip(med, got)],
               [g["step_time_ci_high_s"] * 1e3 - m for m, g in zip(med, got)]]
        ax.bar(xs, med, width, yerr=err, capsize=2, label=f"{int(ws)} GPUs")
    if ref is not None:
        ax.axhline(ref["step_time_median_s"] * 1e3, color="grey", ls="--", lw=1, label="one GPU")
    ax.set_xticks(range(len(strategies)), strategies, fontsize=8, rotation=20, ha="right")
    ax.set_ylabel("median step (ms)", fontsize=8)
    ax.tick_params(axis="y", labelsize=8)
    ax.legend(fontsize=7, frameon=False)
    ax.set_title(f"{rows.iloc[0]['workload']} ({ev.name}): median step, lower is faster; "
                 "whiskers: 95% interval", fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, metadata={"Source": ev.path.relative_to(ROOT).as_posix(), "Software": None})
    plt.close(fig)


def readme_spec(text: str) -> tuple[str, dict[str, list[str]]]:
    m = BLOCK.search(text)
    if m is None:
        raise SystemExit("results_page: README.md has no <!-- result-table: NAME --> ... <!-- /result-table --> block")
    name, *where = m.group("spec").split()
    return name, parse_where(where)


def render_readme(text: str) -> str:
    name, where = readme_spec(text)
    m = BLOCK.search(text)
    return text[: m.start("body")] + readme_block(name, where) + text[m.end("body"):]


# ------------------------------------------------------------------------------------------------ cli


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.results_page", description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if docs/RESULTS.md or the README block is stale")
    ap.add_argument("--readme-table", metavar="NAME", help="print the README's result block for evidence NAME")
    ap.add_argument("--where", action="append", default=[], metavar="COL=V[,V]", help="with --readme-table: keep rows")
    args = ap.parse_args(argv)
    if args.readme_table:
        sys.stdout.write(readme_block(args.readme_table, parse_where(args.where)))
        return 0
    readme = README.read_text()
    want = {RESULTS_MD: render_results(), README: render_readme(readme)}
    if args.check:
        stale = [p.relative_to(ROOT).as_posix() for p, text in want.items() if p.read_text() != text]
        for p in stale:
            print(f"results_page: {p} differs from what docs/evidence/ gives; run {COMMAND}", file=sys.stderr)
        return 1 if stale else 0
    for p, text in want.items():
        p.write_text(text)
    write_figure(*readme_spec(readme))
    print(f"results_page: wrote docs/RESULTS.md, README.md's result block and {FIGURE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
