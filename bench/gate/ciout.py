"""What CI reads from a comparison: a markdown summary, JUnit XML, github-action-benchmark JSON,
and a run exported as a pytest-benchmark JSON file (``pytest-benchmark compare`` reads it)."""

from __future__ import annotations

import contextlib
import json
import os
import xml.etree.ElementTree as ET
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from bench.core import knobs
from bench.core.errors import UserError
from bench.gate.compare import FAILING, KEY, OPTIONAL_KEY
from bench.gate.samples import step_times
from bench.results.run import load_run

#: markdown order: what needs a look first
ORDER = ["regression", "broken", "noisy", "incomparable", "missing", "new", "fixed", "improvement", "not run", "same"]
ICON = {"regression": ":x:", "broken": ":x:", "noisy": ":warning:", "incomparable": ":warning:",
        "missing": ":grey_question:", "improvement": ":rocket:", "fixed": ":white_check_mark:"}


def cell_name(r: pd.Series | dict) -> str:
    """'workload/strategy/backend/device/wsN[/mesh=..][/optimizer=adamw]': one name per cell, stable
    across runs; a training knob is named where it is not what runs trained with before the knobs
    existed (sgd, compile off, no checkpointing), so that a name given then still means that cell."""
    name = "/".join([str(r["workload"]), str(r["strategy"]), str(r["backend"]), str(r["device"]),
                     f"ws{r['world_size']}"])
    name += "".join(f"/{k}={r[k]}" for k in OPTIONAL_KEY if k in r and pd.notna(r[k]) and str(r[k]))
    old = knobs.legacy()
    return name + "".join(f"/{k}={r[k]}" for k in knobs.NAMES
                          if k in r and pd.notna(r[k]) and str(r[k]) not in ("", old[k]))


def _pct(v: Any, fmt: str = "+.1%") -> str:
    return format(v, fmt) if isinstance(v, (int, float, np.floating)) and np.isfinite(v) else "–"


def _md(text: Any) -> str:
    """A table cell: pipes and newlines would break the row; angle brackets would be HTML."""
    return (str(text).replace("\\", "\\\\").replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")
            .replace("\n", " "))


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float, np.number)) and bool(np.isfinite(v))


def shift_text(r: pd.Series | dict) -> str:
    """'+5.1% [+3.0%, +7.2%]' (step time), or '–' when the cell was not tested."""
    if not _finite(r.get("shift", np.nan)):
        return "–"
    return f"{_pct(r['shift'])} [{_pct(r.get('shift_low', np.nan))}, {_pct(r.get('shift_high', np.nan))}]"


def medians_text(r: pd.Series | dict) -> str:
    """'105.52 → 153.28 ms (+45.3%)': the median step of each side's samples (the samples the
    verdict tested; a cell not tested: the cells' medians) and the change between these two."""
    b, c = r.get("base_time_s", np.nan), r.get("cur_time_s", np.nan)
    if not (_finite(b) or _finite(c)):
        return "–"
    change = c / b - 1 if _finite(b) and _finite(c) and b > 0 else np.nan
    return f"{_ms(b).removesuffix(' ms')} → {_ms(c)}" + (f" ({_pct(change)})" if _finite(change) else "")


def basis_text(r: pd.Series | dict) -> str:
    """What the shift is of: the estimator and the samples a side. The Hodges-Lehmann shift is the
    median of CURRENT / BASE over every pair of samples, not the ratio of the two medians."""
    n_b, n_c, unit = r.get("n_base", np.nan), r.get("n_cur", np.nan), r.get("unit")
    if not (_finite(r.get("shift", np.nan)) and _finite(n_b) and _finite(n_c)):
        return "not tested"
    if unit == "runs":
        return f"mean log ratio: {int(n_b)} history runs vs {int(n_c)} repeat median(s)"
    what = {"steps": "pooled steps", "repeats": "repeat medians"}.get(str(unit), str(unit))
    return f"Hodges-Lehmann: {int(n_b)} vs {int(n_c)} {what}"


#: one sentence under every table of verdicts, so the two numbers of a cell are not read as one
SHIFT_LEGEND = ("medians: the median step of each side's samples and their change; shift: the change the verdict "
                "tests, as 'shift of' names it (Hodges-Lehmann: the median of CURRENT / BASE over every pair of "
                "samples; mean log ratio: against a history's runs), which differs from the medians' change when "
                "the samples spread")


def verdict_rows(table: pd.DataFrame) -> pd.DataFrame:
    """The comparison as the texts every output shows, one row per cell: ``cell``, ``verdict``,
    ``medians``, ``shift``, ``basis``, ``noise_floor``, ``note``."""
    return pd.DataFrame([{"cell": cell_name(r), "verdict": str(r["verdict"]), "medians": medians_text(r),
                          "shift": shift_text(r), "basis": basis_text(r),
                          "noise_floor": _pct(r.get("noise_floor"), ".1%"), "note": str(r.get("note") or "")}
                         for _, r in table.iterrows()],
                        columns=["cell", "verdict", "medians", "shift", "basis", "noise_floor", "note"])


def markdown(table: pd.DataFrame, threshold: float, title: str = "parbench compare") -> str:
    """A summary for a pull-request comment or ``$GITHUB_STEP_SUMMARY``: the verdict counts, then
    the cells that need a look, then the rest folded away."""
    counts = table["verdict"].value_counts()
    bad = int(table["verdict"].isin(FAILING).sum())
    head = f"### {title}: " + (f":x: {bad} failing cell(s)" if bad else ":white_check_mark: no regression")
    lines = [head, "", f"Threshold {threshold:.1%} on step time; a cell fails when its slowdown is significant "
             "and its confidence interval reaches the threshold.", "", SHIFT_LEGEND[0].upper() + SHIFT_LEGEND[1:] + ".",
             "",
             " · ".join(f"{v}: {counts[v]}" for v in ORDER if v in counts), ""]
    rank = table["verdict"].map({v: i for i, v in enumerate(ORDER)})
    t = table.assign(_rank=rank).sort_values(["_rank", *KEY], kind="stable")
    header = ["cell", "verdict", "median step base → current", "shift [interval]", "shift of", "noise floor",
              "note"]

    def rows(df: pd.DataFrame) -> list[str]:
        out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for _, r in df.iterrows():
            out.append("| " + " | ".join(_md(x) for x in (
                cell_name(r), f"{ICON.get(r['verdict'], '')} {r['verdict']}".strip(), medians_text(r), shift_text(r),
                basis_text(r), _pct(r.get("noise_floor"), ".1%"), r.get("note") or "")) + " |")
        return out

    look = t[~t["verdict"].isin(["same", "improvement", "fixed", "not run"])]
    rest = t.drop(look.index)
    if len(look):
        lines += rows(look) + [""]
    if len(rest):
        lines += ["<details><summary>" + f"{len(rest)} other cell(s)" + "</summary>", ""] + rows(rest) + [
            "", "</details>", ""]
    return "\n".join(lines)


def _ms(v: Any) -> str:
    return f"{v * 1e3:.2f} ms" if isinstance(v, (int, float, np.floating)) and np.isfinite(v) else "–"


def junit(table: pd.DataFrame, threshold: float, name: str = "parbench.compare") -> str:
    """JUnit XML: one test case per cell; a failure for a regression or a broken cell, skipped for
    cells that were not measured against each other (noisy, incomparable, new, missing, not run)."""
    suite = ET.Element("testsuite", name=name, tests=str(len(table)),
                       failures=str(int(table["verdict"].isin(FAILING).sum())), errors="0",
                       skipped=str(int(table["verdict"].isin(["noisy", "incomparable", "new", "missing",
                                                              "not run"]).sum())),
                       timestamp=datetime.now(timezone.utc).isoformat(timespec="seconds"))
    for _, r in table.iterrows():
        case = ET.SubElement(suite, "testcase", classname=f"{name}.{r['workload']}", name=cell_name(r),
                             time=f"{r['cur_time_s']:.6f}" if np.isfinite(r.get("cur_time_s", np.nan)) else "0")
        msg = f"{r['verdict']}: step time shift {shift_text(r)} (threshold {threshold:.1%})"
        if r.get("note"):
            msg += f"; {r['note']}"
        if r["verdict"] in FAILING:
            ET.SubElement(case, "failure", message=msg, type=str(r["verdict"])).text = msg
        elif r["verdict"] in ("noisy", "incomparable", "new", "missing", "not run"):
            ET.SubElement(case, "skipped", message=msg)
        else:
            ET.SubElement(case, "system-out").text = msg
    ET.indent(suite)
    return ET.tostring(suite, encoding="unicode", xml_declaration=True)


def benchmark_json(table: pd.DataFrame) -> list[dict[str, Any]]:
    """github-action-benchmark's ``customSmallerIsBetter`` entries: the current median step time of
    every cell that ran now, in ms, with the half width of the shift interval as its range."""
    out = []
    for _, r in table.iterrows():
        v = r.get("cur_time_s", np.nan)
        if not (isinstance(v, (int, float, np.floating)) and np.isfinite(v)):
            continue
        half = (r["shift_high"] - r["shift_low"]) / 2 if np.isfinite(r.get("noise_floor", np.nan)) else np.nan
        out.append({"name": cell_name(r), "unit": "ms/step", "value": round(float(v) * 1e3, 6),
                    "range": f"± {half:.1%}" if np.isfinite(half) else "",
                    "extra": f"verdict: {r['verdict']}\nshift: {shift_text(r)}\nsamples: "
                             f"{'' if pd.isna(r.get('n_cur')) else int(r['n_cur'])} {r.get('unit') or ''}".rstrip()})
    return out


def check_output_files(**files: str | None) -> None:
    """Refuse, before any work, an output file that cannot be written: its folder missing or not
    writable, or the path a folder. Keywords are flag names without dashes (markdown=..., junit=...);
    ``-`` (stdout) and None pass."""
    for flag, name in files.items():
        if not name or name == "-":
            continue
        path = Path(name)
        folder = path.parent if str(path.parent) else Path(".")
        why = ("it is a folder" if path.is_dir() else
               f"folder {str(folder)!r} does not exist" if not folder.is_dir() else
               f"folder {str(folder)!r} is not writable" if not os.access(folder, os.W_OK) else
               "the file is not writable" if path.exists() and not os.access(path, os.W_OK) else "")
        if why:
            raise UserError(f"--{flag} {name!r} cannot be written ({why}); pass a file path in a writable folder")


def write_whole(path: str | os.PathLike, text: str, mode: str = "w") -> None:
    """Write ``text`` to ``path`` whole or not at all: a regular file is written beside it and
    renamed over it, so a reader (or a stopped command) never sees half of it. An append, or a path
    that is not a regular file (/dev/stdout, a pipe, a link), is written directly."""
    path = Path(path)
    if mode != "w" or path.is_symlink() or (path.exists() and not path.is_file()):
        with open(path, mode) as f:
            f.write(text)
        return
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)


def _write(flag: str, name: str, text: str, mode: str = "w") -> None:
    try:
        write_whole(name, text, mode)
    except OSError as e:
        raise UserError(f"--{flag} {name!r} cannot be written ({e.strerror or e}); pass a file path in a writable "
                        "folder") from None


def write_outputs(table: pd.DataFrame, threshold: float, *, markdown_file: str | None = None,
                  junit_file: str | None = None, json_file: str | None = None) -> None:
    """Write whichever of the three CI files were asked for. ``-`` as the markdown file, or a path
    equal to $GITHUB_STEP_SUMMARY, appends (GitHub's job summary is one file for all steps)."""
    if markdown_file:
        text = markdown(table, threshold)
        if markdown_file == "-":
            print(text)
        else:
            mode = "a" if os.environ.get("GITHUB_STEP_SUMMARY") == markdown_file else "w"
            _write("markdown", markdown_file, text + "\n", mode)
    if junit_file:
        _write("junit", junit_file, junit(table, threshold))
    if json_file:
        _write("json", json_file, json.dumps(benchmark_json(table), indent=2))


def pytest_benchmark_json(run_dir: str | os.PathLike) -> dict[str, Any]:
    """A run as a pytest-benchmark JSON file: one benchmark per ok cell, its rounds the cell's timed
    steps (slowest rank), so ``pytest-benchmark compare`` and its storage read a parbench run."""
    try:
        from pytest_benchmark import __version__ as pb_version
        from pytest_benchmark.stats import Stats
    except ImportError:
        raise UserError("export --format pytest-benchmark needs pytest-benchmark; "
                        "pip install pytest-benchmark") from None

    cells, steps, meta = load_run(run_dir).trained("export")
    st = step_times(steps)
    benches = []
    for _, c in cells[cells["status"] == "ok"].iterrows():
        data = st.loc[st["cell_id"] == c["cell_id"], "step_time_s"].astype(float).tolist()
        if not data:
            continue
        stats = Stats()
        for d in data:
            stats.update(d)
        name = cell_name(c)
        params = {k: (None if pd.isna(c[k]) else str(c[k])) for k in KEY + OPTIONAL_KEY if k in c}
        benches.append({
            "group": str(c["workload"]), "name": f"parbench[{name}]", "fullname": f"parbench::{name}",
            "params": params, "param": name,
            "extra_info": {k: (None if pd.isna(c.get(k)) else c.get(k).item() if hasattr(c.get(k), "item")
                               else c.get(k)) for k in ("throughput_samples_s", "global_batch", "precision",
                                                        "gpu_name") if k in c},
            "options": {"disable_gc": False, "timer": "perf_counter", "min_rounds": len(data), "max_time": 0,
                        "min_time": 0, "warmup": False},
            "stats": {**stats.as_dict(), "data": data, "iterations": 1},
        })
    commit = str(meta.get("git_commit") or "")
    return {
        "machine_info": {"node": meta.get("host"), "machine": meta.get("platform"), "python_version":
                         meta.get("python"), "torch": meta.get("torch"), "nccl": meta.get("nccl"),
                         "gpus": meta.get("gpus")},
        "commit_info": {"id": commit.removesuffix("-dirty"), "dirty": commit.endswith("-dirty"),
                        "project": "parbench", "branch": None},
        "benchmarks": benches,
        "datetime": meta.get("created_utc") or datetime.now(timezone.utc).isoformat(),
        "version": pb_version,
    }
