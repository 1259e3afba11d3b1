"""The trust boundary (docs/guides/trust.md): report, compare, history and export read folders they did not
write. A hostile run folder runs no code (nothing is unpickled, evaluated or rendered as markup), and
its sizes and nesting are bounded; every case ends ok: the command's output escapes what it shows, or
one line names what was refused."""

from __future__ import annotations

import json
import pickle
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bench.results.store import RunWriter
from tests.faults.harness import Case, check, params
from tests.faults.test_gate import cell, steps, write_meta, write_run

#: markup, mathtext and a path in one string: each must come out as text
EVIL = "<script>alert(1)</script><img src=x onerror=alert(2)>$\\frac{a$&'\"../../x"
#: a file the payloads below create if anything ever runs them
MARKER = "pwned"


class Payload:
    """Unpickling this writes MARKER beside the folder: proof that code from the folder ran."""

    def __init__(self, where: Path):
        self.where = str(where)

    def __reduce__(self):
        return (Path.write_text, (Path(self.where), "ran"))


def hostile_run(tmp: Path, name: str = "run") -> Path:
    """A run folder with EVIL in every string field of its cells and meta.json."""
    d = tmp / name
    w = RunWriter(d)
    for cid, (strategy, ws, t) in enumerate((("single", 1, 0.1), (f"ddp{EVIL}", 2, 0.06), (EVIL, 2, 0.07))):
        row = cell(cid, strategy, ws, t, workload=f"mlp{EVIL}", backend=EVIL, device=f"cpu{EVIL}",
                   precision="fp32", gpu_name=EVIL, reason=EVIL)
        row["role"] = "reference" if ws == 1 else EVIL
        w.add(row, steps(cid, t))
    w.add({**cell(9, "fsdp", 2, 0.1, workload=f"mlp{EVIL}"), "status": EVIL, "reason": EVIL})
    write_meta(d, run_id=f"{EVIL}{name}", host=EVIL, torch=EVIL, nccl=EVIL, git_commit=EVIL, created_utc=EVIL,
               plan=EVIL, gpus=[EVIL, EVIL], workloads={f"mlp{EVIL}": EVIL}, telemetry={EVIL: EVIL})
    return d


def page_is_inert(page: str):
    """The report's page shows EVIL as text: the page's own one script, no tag or handler from the run."""
    def kept(tmp: Path) -> list[str]:
        path = tmp / page
        if not path.is_file():
            return [f"{page} was not written"]
        html = path.read_text()
        lost = []
        if html.count("<script") != 1 or "<img src=x" in html:
            lost.append("markup from the run reached the page")
        if "&lt;script&gt;alert(1)&lt;/script&gt;" not in html:
            lost.append("the run's strings are not on the page as text")
        names = [p.name for p in path.parent.rglob("*")]
        lost += [f"file name from the run: {n!r}" for n in names if not re.fullmatch(r"[A-Za-z0-9_.=-]+", n)]
        return lost
    return kept


def not_run(tmp: Path) -> list[str]:
    return [f"code from the folder ran: {p}" for p in tmp.rglob(MARKER)]


def object_metadata(tmp: Path) -> None:
    """Cells whose pandas metadata asks for Python objects, their bytes a pickle that writes MARKER."""
    write_run(tmp)
    part = next((tmp / "run" / "cells.parquet").glob("part-*.parquet"))
    table = pq.read_table(part)
    blob = pickle.dumps(Payload(tmp / MARKER))
    table = table.append_column("payload", pa.array([blob] * len(table), pa.binary()))
    cols = [{"name": n, "field_name": n, "pandas_type": "object", "numpy_type": "object", "metadata": None}
            for n in table.column_names]
    meta = {"index_columns": [], "column_indexes": [], "columns": cols, "attributes": {"evil": blob.hex()},
            "creator": {"library": "pyarrow", "version": "1"}, "pandas_version": "2.0.0"}
    pq.write_table(table.replace_schema_metadata({b"pandas": json.dumps(meta).encode()}), part)


def planted_pickle(as_part: bool):
    def setup(tmp: Path) -> None:
        write_run(tmp)
        blob = pickle.dumps(Payload(tmp / MARKER))
        if as_part:  # named like a part of the cells table
            (tmp / "run" / "cells.parquet" / "part-999999.parquet").write_bytes(blob)
        for name in ("cells.pkl", "meta.pkl", "steps.pickle", "report.pkl"):
            (tmp / "run" / name).write_bytes(blob)
    return setup


def big_meta(tmp: Path) -> None:
    write_run(tmp)
    with open(tmp / "run" / "meta.json", "w") as f:
        f.write('{"run_id": "run", "pad": "')
        f.write("x" * (50 * 2**20))
        f.write('"}')


def deep_meta(levels: int):
    def setup(tmp: Path) -> None:
        write_run(tmp)
        (tmp / "run" / "meta.json").write_text('{"config": ' + "[" * levels + "]" * levels + "}")
    return setup


def hostile_history(tmp: Path) -> None:
    from bench.gate.history import add

    hostile_run(tmp, "run")
    for i in range(2):
        add(hostile_run(tmp, f"h{i}"), tmp / "hist", commit=f"{EVIL}{i}")


R = "{tmp}/run"
CASES = [
    Case("report-hostile-strings", "report", ["report", R], "index.html", code=0, setup=hostile_run,
         kept=page_is_inert("run/report/index.html")),
    Case("report-hostile-baseline", "report", ["report", R, "--baseline", "{tmp}/base", "-o", "{tmp}/out"],
         "index.html", code=0, setup=lambda tmp: (hostile_run(tmp), hostile_run(tmp, "base")),
         kept=page_is_inert("out/index.html")),
    Case("report-hostile-history", "report", ["report", R, "--history", "{tmp}/hist", "-o", "{tmp}/out"],
         "index.html", code=0, setup=hostile_history, kept=page_is_inert("out/index.html")),
    Case("compare-hostile-markdown", "compare", ["compare", R, R, "--markdown", "{tmp}/s.md", "--junit",
                                                 "{tmp}/j.xml"], "same", code=0, setup=hostile_run,
         kept=lambda tmp: ["markup in the markdown"] * ("<script" in (tmp / "s.md").read_text())
         + ["markup in the JUnit file"] * ("<script" in (tmp / "j.xml").read_text())),
    Case("history-show-hostile", "history", ["history", "show", "--store", "{tmp}/hist", "--plots", "{tmp}/plots"],
         "trend figures", code=0, setup=hostile_history,
         kept=lambda tmp: [p.name for p in (tmp / "plots").iterdir() if not re.fullmatch(r"[A-Za-z0-9_.=-]+", p.name)]),
    Case("report-object-metadata", "report", ["report", R], "index.html", code=0, setup=object_metadata,
         kept=not_run),
    Case("compare-object-metadata", "compare", ["compare", R, R], "same", code=0, setup=object_metadata,
         kept=not_run),
    Case("report-planted-pickle-part", "report", ["report", R], "part-999999.parquet cannot be read",
         setup=planted_pickle(True), kept=not_run),
    Case("report-planted-pickle-files", "report", ["report", R], "index.html", code=0,
         setup=planted_pickle(False), kept=not_run),
    Case("history-add-planted-pickle", "history", ["history", "add", R, "--store", "{tmp}/hist"],
         "part-999999.parquet cannot be read", setup=planted_pickle(True), kept=not_run),
    Case("report-meta-50mb", "report", ["report", R], "meta.json is 50 MiB, over the 8 MiB", setup=big_meta),
    Case("compare-meta-50mb", "compare", ["compare", R, R], "meta.json is 50 MiB, over the 8 MiB", setup=big_meta),
    Case("report-meta-10000-deep", "report", ["report", R], "meta.json is nested more than 32 levels deep",
         setup=deep_meta(10_000)),
    Case("history-add-meta-10000-deep", "history", ["history", "add", R, "--store", "{tmp}/hist"],
         "meta.json is nested more than 32 levels deep", setup=deep_meta(10_000)),
    Case("export-meta-40-deep", "export", ["export", R, "--format", "pytest-benchmark", "-o", "{tmp}/o.json"],
         "meta.json is nested more than 32 levels deep", setup=deep_meta(40)),
    Case("compare-rows-over-limit", "compare", ["compare", R, R], "steps.parquet declares 24 rows, over the 10",
         setup=write_run, env={"PARBENCH_MAX_ROWS": "10"}),
]


@pytest.mark.parametrize("case", params(CASES))
def test_trust(case, tmp_path):
    check(case, tmp_path)


def test_too_many_parts_is_one_line(tmp_path, monkeypatch):
    """The part limit (100,000 a table) at 3: a folder of 4 parts is refused by name."""
    monkeypatch.setattr("bench.results.bounds.MAX_PARTS", 3)
    case = Case("report-parts-over-limit", "report", ["report", R], "cells.parquet has 4 part files, over the 3",
                setup=lambda tmp: write_run(tmp, workloads=("a", "b")))
    check(case, tmp_path)


PRODUCT = [p for pkg in ("bench", "reports", "strategies") for p in (Path(__file__).parents[2] / pkg).rglob("*.py")]
#: calls that would run code from a file, or render a run's strings as markup
NEVER = re.compile(r"\bpickle\.loads?\(|read_pickle\(|(?<![.\w])eval\(|(?<![.\w])exec\(|torch\.load\(|yaml\.load\(|"
                   r"allow_pickle=True|autoescape=False|Markup\(|\|\s*safe\b")


def test_no_reader_runs_code_from_a_file():
    """Nothing in the product unpickles, evaluates or marks a run's text as safe markup; the one
    ``|safe`` is the comparison table, which html.py builds from escaped strings."""
    found = [f"{p.relative_to(p.parents[1])}:{n}: {line.strip()}" for p in PRODUCT
             for n, line in enumerate(p.read_text().splitlines(), 1) if NEVER.search(line)]
    assert [f for f in found if "comparison.html|safe" not in f] == []
