"""Fault cases of the commands that read results: report, compare, history and export. Their inputs
are run folders and history stores that another tool, an older or newer parbench, a full disk or a
stopped command may have written; each case ends with one line and exit 2 (or the documented exit
and nothing lost). The run folders are written in-process with RunWriter or pyarrow, never by
running a benchmark."""

from __future__ import annotations

import errno
import json
import signal
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bench.results.store import RunWriter
from tests.faults.harness import Case, check, params

CELLS = (("single", 1, 0.10), ("ddp", 2, 0.06))


def cell(cid: int, strategy: str, ws, t: float, workload: str = "mlp", **more) -> dict:
    """One cell row as parbench writes it; ``more`` adds or replaces fields."""
    return {**dict(cell_id=cid, workload=workload, strategy=strategy, backend="gloo", device="cpu", world_size=ws,
                   status="ok", precision="fp32", global_batch=8, role="reference" if ws == 1 else "data-parallel",
                   step_time_median_s=t, step_time_ci_low_s=t * 0.99, step_time_ci_high_s=t * 1.01,
                   throughput_samples_s=8 / t), **more}


def steps(cid: int, t: float, n: int = 12) -> list[dict]:
    return [dict(cell_id=cid, repeat=0, rank=0, step=s, phase="timed", step_time_s=t * (1 + 0.01 * (s % 3)),
                 loss=1.0, loss_weight=1.0) for s in range(n)]


def write_meta(d: Path, **more) -> None:
    meta = {"schema_version": 1, "run_id": d.name, "git_commit": "c0", "host": "h", "torch": "2.13",
            "created_utc": "2026-11-26T00:00:00+00:00", **more}
    (d / "meta.json").write_text(json.dumps(meta))


def write_run(tmp: Path, name: str = "run", workloads=("mlp",), status: str = "ok", with_steps: bool = True,
              **meta) -> Path:
    """A small run folder: per workload a one-device and a two-device cell with 12 timed steps."""
    d = tmp / name
    w = RunWriter(d)
    cid = 0
    for wl in workloads:
        for strategy, ws, t in CELLS:
            row = cell(cid, strategy, ws, t, wl)
            if status != "ok":
                row.update(status=status, reason="RuntimeError: boom", throughput_samples_s=None,
                           step_time_median_s=None)
            w.add(row, steps(cid, t) if with_steps and status == "ok" else [])
            cid += 1
    write_meta(d, **meta)
    return d


def foreign_cells(tmp: Path, name: str, rows: list[dict], more_parts: list[list[dict]] = ()) -> Path:
    """A run folder whose cells another tool wrote: column types as pyarrow infers them."""
    d = tmp / name
    (d / "cells.parquet").mkdir(parents=True)
    for i, part in enumerate([rows, *more_parts], 1):
        pq.write_table(pa.Table.from_pylist(part), d / "cells.parquet" / f"part-{i:06d}.parquet")
    RunWriter(d, resume=True).append("steps", [s for r in rows if "cell_id" in r
                                               for s in steps(r["cell_id"], r["step_time_median_s"])])
    write_meta(d)
    return d


def text_ws(value: str):
    """CURRENT's world sizes written as text ("1.0", "2.0" from a tool that wrote floats as text)."""
    def setup(tmp: Path) -> None:
        write_run(tmp, "base")
        foreign_cells(tmp, "cur", [cell(i, s, value.format(ws=ws), t) for i, (s, ws, t) in enumerate(CELLS)])
    return setup


def future_run(tmp: Path, name: str = "run", status: str = "ok") -> Path:
    """A run of a newer schema: a higher schema_version, a column and a status this parbench does not know."""
    d = foreign_cells(tmp, name, [cell(0, "single", 1, 0.1, energy_per_token_j=0.5),
                                  cell(1, "ddp", 2, 0.06, energy_per_token_j=0.4, status=status)])
    write_meta(d, schema_version=99, new_field={"nested": [1, 2]})
    return d


def no_meta(tmp: Path) -> None:
    (write_run(tmp) / "meta.json").unlink()


def file_at(name: str, text: str = "x"):
    def setup(tmp: Path) -> None:
        write_run(tmp)
        (tmp / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp / name).write_text(text)
    return setup


def history(tmp: Path, runs: int = 2) -> Path:
    """A history store of ``runs`` runs, commits c0, c1, ..."""
    from bench.gate.history import add

    for i in range(runs):
        add(write_run(tmp, f"h{i}"), tmp / "hist", commit=f"c{i}")
    return tmp / "hist"


def stored(tmp: Path, seq: int) -> Path:
    return next((tmp / "hist").glob(f"*/{seq:06d}-*.parquet"))


def damaged_history(how: str, runs: int = 2):
    """A history whose last stored run (or index) is damaged as ``how`` says."""
    def setup(tmp: Path) -> None:
        store = history(tmp, runs)
        write_run(tmp)
        last, index = stored(tmp, runs - 1), store / "index.jsonl"
        if how == "truncated-parquet":
            last.write_bytes(last.read_bytes()[:50])
        elif how == "wrong-columns":
            pq.write_table(pa.table({"x": [1]}), last)
        elif how == "folder-for-file":
            last.unlink()
            last.mkdir()
        elif how == "torn-index":
            index.write_text(index.read_text()[:-40])
        elif how == "index-folder":
            index.unlink()
            index.mkdir()
        elif how == "index-garbage":
            index.write_text("not json\n[1]\n")
        elif how == "machine-info-odd":
            lines = [json.loads(line) for line in index.read_text().splitlines()]
            index.write_text("".join(json.dumps({**e, "machine_info": {"gpus": 8, "torch": ["x"]}}) + "\n"
                                     for e in lines))
        elif how == "index-escapes":
            e = json.loads(index.read_text().splitlines()[0])
            index.write_text(index.read_text() + json.dumps({**e, "seq": 7, "run_id": "x",
                                                             "file": "../../outside.parquet"}) + "\n")
    return setup


def index_lines(tmp: Path) -> list[str]:
    p = tmp / "hist" / "index.jsonl"
    return p.read_text().splitlines() if p.is_file() else []


def history_kept(runs: int, added: int | None = None, litter: bool = False):
    """The first ``runs`` runs are still listed, every listed run is readable; with ``added``, that
    many are listed in all; unless ``litter``, no stored file is left unlisted."""
    def kept(tmp: Path) -> list[str]:
        from bench.gate.history import load

        lost = []
        try:
            index, rows = load(tmp / "hist")
        except Exception as e:  # noqa: BLE001 - an unreadable store is the finding
            return [f"store unreadable: {e}"]
        if sorted(index["seq"])[:runs] != list(range(runs)) or set(index["seq"]) - set(rows["seq"]):
            lost.append(f"runs listed {sorted(index['seq'])}, read {sorted(set(rows['seq']))}")
        if added is not None and len(index) != added:
            lost.append(f"{len(index)} runs listed, expected {added}")
        files = {str(p.relative_to(tmp / "hist")) for p in (tmp / "hist").rglob("*.parquet*")}
        if not litter and files - set(index["file"]):
            lost.append(f"unlisted files {sorted(files - set(index['file']))}")
        return lost
    return kept


def empty_cells(tmp: Path) -> None:
    """A run folder whose cells table has parbench's columns and no row."""
    from bench.results.store import CELL_COLUMNS, arrow_schema

    (tmp / "run" / "cells.parquet").mkdir(parents=True)
    pq.write_table(arrow_schema(CELL_COLUMNS).empty_table(), tmp / "run" / "cells.parquet" / "part-000001.parquet")
    write_meta(tmp / "run")


def unchanged(path: str, text: str):
    def kept(tmp: Path) -> list[str]:
        p = tmp / path
        return [] if p.is_file() and p.read_text() == text else [f"{path} changed or gone"]
    return kept


def json_file(path: str):
    def kept(tmp: Path) -> list[str]:
        try:
            doc = json.loads((tmp / path).read_text())
        except (OSError, ValueError) as e:
            return [f"{path}: {e}"]
        return [] if doc.get("benchmarks") else [f"{path} has no benchmarks"]
    return kept


def serve_run(tmp: Path, name: str = "serve") -> Path:
    """A serving run's folder (parbench serve): its cells are of mode serve, with no step times."""
    d = tmp / name
    RunWriter(d).add({"cell_id": 0, "workload": "mlp", "strategy": "replicas", "backend": "gloo", "device": "cpu",
                      "world_size": 1, "mode": "serve", "status": "ok"}, [])
    write_meta(d)
    return d


def serve_and_run(tmp: Path) -> None:
    write_run(tmp)
    serve_run(tmp)


R = "{tmp}/run"
SV = "{tmp}/serve"
SERVING = "{tmp}/serve is a serving run's folder (parbench serve): "
#: the fewest columns a cells table may have (another tool's)
MINIMAL = dict(cell_id=0, workload="mlp", strategy="ddp", backend="gloo", world_size=2, status="ok",
               step_time_median_s=0.1)
CASES = [
    # a serving run's folder given to a command that reads training runs
    Case("compare-serving-folder-as-current", "compare", ["compare", R, SV], SERVING + "compare reads the step times",
         setup=serve_and_run),
    Case("compare-serving-folder-as-base", "compare", ["compare", SV, R], SERVING + "compare reads the step times",
         setup=serve_and_run),
    Case("export-serving-folder", "export", ["export", SV, "--format", "pytest-benchmark", "-o", "{tmp}/e.json"],
         SERVING + "export reads the step times", setup=serve_run),
    # report
    Case("report-out-under-file", "report", ["report", R, "-o", "{tmp}/run/meta.json/out"],
         "cannot be written (a part of the path is a file)", setup=write_run),
    Case("report-baseline-is-file", "report", ["report", R, "--baseline", "{tmp}/run/meta.json"],
         "--baseline '{tmp}/run/meta.json' is not a folder", setup=write_run),
    Case("report-baseline-and-history", "report", ["report", R, "--baseline", R, "--history", R],
         "give --baseline RUN or --history DIR, not both", setup=write_run),
    Case("report-history-empty-store", "report", ["report", R, "--history", "{tmp}/empty"],
         "{tmp}/empty holds no history", setup=file_at("empty/README", "")),
    Case("report-world-size-word", "report", ["report", "{tmp}/cur"],
         "column 'world_size' holds 'two', which is not an integer", setup=text_ws("two")),
    Case("report-meta-gpus-number", "report", ["report", R], "'gpus' is 4, not a list",
         setup=lambda tmp: write_run(tmp, gpus=4)),
    Case("report-meta-telemetry-text", "report", ["report", R], "'telemetry' is 'on', not an object",
         setup=lambda tmp: write_run(tmp, telemetry="on")),
    Case("report-only-failed-cells", "report", ["report", R], "{tmp}/run/report/index.html", code=0,
         setup=lambda tmp: write_run(tmp, status="failed")),
    Case("report-future-schema", "report", ["report", R], "{tmp}/run/report/index.html", code=0,
         setup=lambda tmp: future_run(tmp, status="preempted")),
    Case("report-minimal-foreign", "report", ["report", R], "{tmp}/run/report/index.html", code=0,
         setup=lambda tmp: foreign_cells(tmp, "run", [MINIMAL])),
    Case("report-without-cell-id", "report", ["report", R], "lacks column(s) cell_id",
         setup=lambda tmp: foreign_cells(tmp, "run", [{k: v for k, v in MINIMAL.items() if k != "cell_id"}])),
    Case("report-no-meta", "report", ["report", R], "{tmp}/run/report/index.html", code=0, setup=no_meta),
    # compare
    Case("compare-future-schema", "compare", ["compare", "{tmp}/base", R], "same: 2", code=0,
         setup=lambda tmp: (write_run(tmp, "base"), future_run(tmp))),
    Case("compare-minimal-foreign", "compare", ["compare", R, R], "BASE run has no throughput_samples_s column",
         setup=lambda tmp: foreign_cells(tmp, "run", [MINIMAL])),
    Case("compare-no-meta", "compare", ["compare", R, R], "same: 2", code=0, setup=no_meta),
    Case("compare-world-size-text", "compare", ["compare", "{tmp}/base", "{tmp}/cur"], "same: 2", code=0,
         setup=text_ws("{ws}.0")),
    Case("compare-world-size-fraction", "compare", ["compare", "{tmp}/base", "{tmp}/cur"],
         "{tmp}/cur/cells.parquet: column 'world_size' holds '2.5', which is not an integer",
         setup=text_ws("2.5")),
    Case("compare-parts-disagree", "compare", ["compare", "{tmp}/base", "{tmp}/cur"], "same: 2", code=0,
         setup=lambda tmp: (write_run(tmp, "base"), foreign_cells(tmp, "cur", [cell(0, "single", 1, 0.1)],
                                                                  [[cell(1, "ddp", "2", 0.06)]]))),
    Case("compare-throughput-word", "compare", ["compare", "{tmp}/base", "{tmp}/cur"],
         "column 'throughput_samples_s' holds 'fast', which is not a number",
         setup=lambda tmp: (write_run(tmp, "base"), foreign_cells(
             tmp, "cur", [{**cell(0, "single", 1, 0.1), "throughput_samples_s": "fast"}]))),
    Case("compare-nothing-in-common", "compare", ["compare", "{tmp}/base", "{tmp}/cur"],
         "the two runs share no cell", setup=lambda tmp: (write_run(tmp, "base"),
                                                          write_run(tmp, "cur", workloads=("convnet",)))),
    Case("compare-now-failing", "compare", ["compare", "{tmp}/base", "{tmp}/cur"], "2 broken", code=1,
         setup=lambda tmp: (write_run(tmp, "base"), write_run(tmp, "cur", status="preempted"))),
    Case("compare-threshold-zero", "compare", ["compare", R, R, "--threshold", "0%"],
         "threshold '0%' must be between 0% and 100%"),
    Case("compare-threshold-ambiguous", "compare", ["compare", R, R, "--threshold", "5"],
         "threshold '5' is ambiguous"),
    Case("compare-threshold-nan", "compare", ["compare", R, R, "--threshold", "nan%"],
         "threshold 'nan%' must be between"),
    Case("compare-three-runs", "compare", ["compare", R, R, R], "got 3 run folder(s), expected 2", setup=write_run),
    Case("compare-fail-from-runs-alone", "compare", ["compare", R, R, "--fail-from-runs", "4"],
         "--fail-from-runs 4 applies to --history only", setup=write_run),
    Case("compare-history-unknown-machine", "compare", ["compare", "--history", "{tmp}/hist", R, "--machine", "m9"],
         "has no runs of machine m9", setup=lambda tmp: (history(tmp, 1), write_run(tmp))),
    Case("compare-test-unknown", "compare", ["compare", R, R, "--test", "ttest"], "invalid choice: 'ttest'"),
    Case("compare-markdown-disk-full", "compare", ["compare", R, R, "--markdown", "/dev/full"],
         "--markdown '/dev/full' cannot be written (No space left on device)", setup=write_run),
    Case("compare-junit-in-proc", "compare", ["compare", R, R, "--junit", "/proc/parbench.xml"],
         "--junit '/proc/parbench.xml' cannot be written", setup=write_run),
    # history
    Case("history-no-subcommand", "history", ["history"], "the following arguments are required: COMMAND"),
    Case("history-show-empty-store", "history", ["history", "show", "--store", "{tmp}/empty"],
         "{tmp}/empty holds no history", setup=file_at("empty/README", "")),
    Case("history-show-threshold-high", "history", ["history", "show", "--store", "{tmp}/hist", "--threshold",
                                                    "200%"], "threshold '200%' must be between"),
    Case("history-show-index-folder", "history", ["history", "show", "--store", "{tmp}/hist"],
         "index.jsonl is not a file", setup=damaged_history("index-folder")),
    Case("history-show-index-garbage", "history", ["history", "show", "--store", "{tmp}/hist"],
         "index.jsonl line 1: not JSON, and no line of it is an entry", setup=damaged_history("index-garbage")),
    Case("history-show-only-run-truncated", "history", ["history", "show", "--store", "{tmp}/hist"],
         "none of the 1 run(s)", setup=damaged_history("truncated-parquet", runs=1)),
    Case("history-show-only-run-wrong-columns", "history", ["history", "show", "--store", "{tmp}/hist"],
         "lacks column(s) workload", setup=damaged_history("wrong-columns", runs=1)),
    # the rest of a damaged store still loads (the warning naming the damage: tests/unit/test_history.py)
    Case("history-show-skips-truncated", "history", ["history", "show", "--store", "{tmp}/hist"],
         "mlp/single/gloo/cpu/ws1", code=0, setup=damaged_history("truncated-parquet")),
    Case("history-show-skips-folder", "history", ["history", "show", "--store", "{tmp}/hist"],
         "mlp/single/gloo/cpu/ws1", code=0, setup=damaged_history("folder-for-file")),
    Case("history-show-skips-escape", "history", ["history", "show", "--store", "{tmp}/hist"],
         "mlp/single/gloo/cpu/ws1", code=0, setup=damaged_history("index-escapes")),
    Case("compare-history-odd-machine-info", "compare", ["compare", "--history", "{tmp}/hist", R],
         "incomparable: torch ['x'] vs 2.13: measure both sides with one torch",
         setup=damaged_history("machine-info-odd")),
    Case("history-add-after-torn-line", "history", ["history", "add", R, "--store", "{tmp}/hist"],
         "added run run", code=0, setup=damaged_history("torn-index"),
         kept=history_kept(1, added=2, litter=True)),
    Case("history-add-index-folder", "history", ["history", "add", R, "--store", "{tmp}/hist"],
         "index.jsonl is not a file", setup=damaged_history("index-folder")),
    Case("history-add-run-id-with-slashes", "history", ["history", "add", R, "--store", "{tmp}/hist"],
         "added run ../x/evil", code=0, setup=lambda tmp: write_run(tmp, run_id="../x/evil"),
         kept=history_kept(0, added=1)),
    Case("history-add-no-meta", "history", ["history", "add", R, "--store", "{tmp}/hist"],
         "{tmp}/run has no git_commit in meta.json; run from a git checkout or pass --commit SHA", setup=no_meta),
    # export
    Case("export-future-schema", "export", ["export", R, "--format", "pytest-benchmark", "-o", "{tmp}/o.json"],
         "2 benchmark(s)", code=0, setup=future_run, kept=json_file("o.json")),
    Case("export-only-failed", "export", ["export", R, "--format", "pytest-benchmark", "-o", "{tmp}/o.json"],
         "has no ok cell with step times", setup=lambda tmp: write_run(tmp, status="failed")),
    Case("export-no-steps", "export", ["export", R, "--format", "pytest-benchmark", "-o", "{tmp}/o.json"],
         "has no ok cell with step times", setup=lambda tmp: write_run(tmp, with_steps=False)),
    Case("export-no-rows", "export", ["export", R, "--format", "pytest-benchmark", "-o", "{tmp}/o.json"],
         "has no ok cell with step times", setup=empty_cells),
    Case("export-cpu-only", "export", ["export", R, "--format", "pytest-benchmark", "-o", "{tmp}/o.json"],
         "2 benchmark(s)", code=0, setup=write_run, kept=json_file("o.json")),
    Case("export-world-size-text", "export", ["export", "{tmp}/cur", "--format", "pytest-benchmark", "-o",
                                              "{tmp}/o.json"], "2 benchmark(s)", code=0, setup=text_ws("{ws}.0"),
         kept=json_file("o.json")),
    Case("export-disk-full", "export", ["export", R, "--format", "pytest-benchmark", "-o", "/dev/full"],
         "-o '/dev/full' cannot be written (No space left on device)", setup=write_run),
    Case("export-onto-folder", "export", ["export", R, "--format", "pytest-benchmark", "-o", "{tmp}"],
         "cannot be written (Is a directory)", setup=write_run),
    Case("export-under-file", "export", ["export", R, "--format", "pytest-benchmark", "-o",
                                         "{tmp}/run/meta.json/o.json"], "cannot be written", setup=write_run),
    Case("export-format-unknown", "export", ["export", R, "--format", "csv", "-o", "{tmp}/o.json"],
         "invalid choice: 'csv'"),
    Case("export-keeps-old-file", "export", ["export", R, "--format", "pytest-benchmark", "-o", "{tmp}/o.json"],
         "has no ok cell", setup=lambda tmp: (write_run(tmp, status="failed"), (tmp / "o.json").write_text("old")),
         kept=unchanged("o.json", "old")),
]


@pytest.mark.parametrize("case", params(CASES))
def test_gate(case, tmp_path):
    check(case, tmp_path)


def _raise(code: int):
    def fail(*_a, **_k):
        raise OSError(code, __import__("os").strerror(code))
    return fail


#: case id -> what fails with which errno (an in-process patch: as root, chmod stops nothing)
PATCHED = {
    "report-disk-full": ("reports.figures.save", errno.ENOSPC),
    "report-permission-denied": ("reports.html._publish", errno.EACCES),
    "history-add-disk-full-cells": ("pandas.DataFrame.to_parquet", errno.ENOSPC),
    "history-add-disk-full-index": ("bench.gate.history._append_line", errno.ENOSPC),
}
PATCHED_CASES = [
    Case("report-disk-full", "report", ["report", R], "cannot be written (No space left on device)",
         setup=lambda tmp: (write_run(tmp), (tmp / "run" / "report").mkdir(),
                            (tmp / "run" / "report" / "index.html").write_text("previous")),
         kept=lambda tmp: unchanged("run/report/index.html", "previous")(tmp)
         + [str(p) for p in (tmp / "run" / "report").glob(".parbench*")]),
    Case("report-permission-denied", "report", ["report", R], "cannot be written (Permission denied)",
         setup=write_run),
    Case("history-add-disk-full-cells", "history", ["history", "add", R, "--store", "{tmp}/hist"],
         "--store '{tmp}/hist' cannot be written (No space left on device)", setup=damaged_history("none", 1),
         kept=history_kept(1, added=1)),
    Case("history-add-disk-full-index", "history", ["history", "add", R, "--store", "{tmp}/hist"],
         "--store '{tmp}/hist' cannot be written (No space left on device)", setup=damaged_history("none", 1),
         kept=history_kept(1, added=1)),
]


@pytest.mark.parametrize("case", params(PATCHED_CASES))
def test_gate_write_fails(case, tmp_path, monkeypatch):
    target, code = PATCHED[case.id]
    if case.setup is not None:  # written before the patch: only the command's own writes fail
        case.setup(tmp_path)
        case = Case(**{**case.__dict__, "setup": None})
    monkeypatch.setattr(target, _raise(code))
    check(case, tmp_path)


def _previous_report(tmp: Path) -> None:
    write_run(tmp, workloads=tuple(f"w{i}" for i in range(8)))
    (tmp / "run" / "report").mkdir()
    (tmp / "run" / "report" / "index.html").write_text("previous")


def _report_kept(tmp: Path) -> list[str]:
    lost = unchanged("run/report/index.html", "previous")(tmp)
    return lost + [f"left behind: {p.name}" for p in (tmp / "run" / "report").glob(".parbench*")]


def large_run(tmp: Path, cells: int = 200) -> None:
    """A history of two runs and a run of ``cells`` cells to add (about a second to read), written
    whole, one part a table."""
    from bench.results.store import CELL_COLUMNS, STEP_COLUMNS, arrow_schema

    history(tmp, 2)
    d = tmp / "run"
    for name, rows, cols in (("cells", [cell(i, f"s{i}", 2, 0.1) for i in range(cells)], CELL_COLUMNS),
                             ("steps", [s for i in range(cells) for s in steps(i, 0.1)], STEP_COLUMNS)):
        (d / f"{name}.parquet").mkdir(parents=True)
        schema = pa.schema([f for f in arrow_schema(cols) if f.name in rows[0]])
        pq.write_table(pa.Table.from_pylist(rows, schema=schema), d / f"{name}.parquet" / "part-000001.parquet")
    write_meta(d)


SIGNALLED = [
    Case("report-sigint", "report", ["-v", "report", R], "interrupted by SIGINT: no report was written",
         code=130, setup=_previous_report, kept=_report_kept, signal=(signal.SIGINT, "drawing the report"),
         group=True, one_line=False),
    Case("report-sigterm", "report", ["-v", "report", R], "interrupted by SIGTERM: no report was written",
         code=143, setup=_previous_report, kept=_report_kept, signal=(signal.SIGTERM, "drawing the report"),
         one_line=False),
    Case("history-add-sigkill", "history", ["-v", "history", "add", R, "--store", "{tmp}/hist"],
         setup=damaged_history("none", 2), kept=history_kept(2, litter=True), signal=(signal.SIGKILL, "adding run")),
    Case("history-add-sigterm", "history", ["-v", "history", "add", R, "--store", "{tmp}/hist"],
         "interrupted by SIGTERM: the run was not added", code=143, setup=large_run, kept=history_kept(2, added=2),
         signal=(signal.SIGTERM, "reading run"), one_line=False),
]


@pytest.mark.parametrize("case", params(SIGNALLED))
def test_gate_signals(case, tmp_path):
    check(case, tmp_path)
