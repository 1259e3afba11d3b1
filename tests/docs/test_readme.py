"""README.md: short, in its order, the set-up commands as they are, and a result table whose every
number is in the evidence table it names (read here on its own, not through tools/results_page.py)."""

from __future__ import annotations

import re
import struct
import zlib
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
SETUP = [
    "python3 -m pip install nox && nox -s bench     # run the default benchmark for this machine and build its "
    "report",
    "python3 -m pip install nox && nox -s tests     # run the tests (CPU only: unit, real gloo processes, GPU tests "
    "skip)",
]
SECTIONS = ["A measured result", "What a run produces", "First commands", "Guides"]


@pytest.fixture(scope="module")
def text() -> str:
    return README.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def block(text) -> tuple[str, dict[str, list[str]], str]:
    m = re.search(r"<!-- result-table: (?P<spec>[^>]*?) -->\n(?P<body>.*?)<!-- /result-table -->", text, re.S)
    assert m, "README.md has no result-table block"
    name, *where = m.group("spec").split()
    return name, {k: v.split(",") for k, v in (w.split("=", 1) for w in where)}, m.group("body")


def test_the_readme_is_short(text):
    assert 60 <= len(text.splitlines()) <= 105


def test_the_set_up_commands_are_the_two_lines_users_know(text):
    lines = text.splitlines()
    for line in SETUP:
        assert line in lines


def test_the_sections_come_in_their_order(text):
    headings = re.findall(r"^## (.*)$", text, re.M)
    assert headings == SECTIONS
    assert text.index(SETUP[0]) < text.index("## A measured result")


def test_the_block_is_what_the_script_writes(text):
    from tools import results_page

    assert results_page.render_readme(text) == text, "run python -m tools.results_page"


def _evidence(name: str) -> pd.DataFrame:
    for ext, read in (("parquet", pd.read_parquet), ("csv", pd.read_csv)):
        path = ROOT / "docs" / "evidence" / f"{name}.{ext}"
        if path.exists():
            return read(path)
    raise AssertionError(f"README cites docs/evidence/{name}, which does not exist")


def _rows(body: str) -> list[dict[str, str]]:
    lines = [ln for ln in body.splitlines() if ln.startswith("|")]
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    assert head in (["strategy", "GPUs", "median step (ms)", "95% interval (ms)", "speedup vs one GPU"],
                    ["strategy", "GPUs", "repeats", "median step (ms)", "95% interval (ms)", "speedup vs one GPU"])
    return [dict(zip(head, (c.strip() for c in ln.strip("|").split("|")))) for ln in lines[2:]]


def test_every_number_in_the_result_table_is_in_the_evidence_it_cites(block):
    name, where, body = block
    df = _evidence(name)
    for col, vals in where.items():
        df = df[df[col].astype(str).isin(vals)]
    df = df[df["status"] == "ok"]
    rows = _rows(body)
    assert rows, "the README's result table is empty"
    ref = df[(df.strategy == "single") & (df.world_size == 1)].step_time_median_s
    for row in rows:
        strategy, gpus, median = row["strategy"], row["GPUs"], row["median step (ms)"]
        interval, speedup, reps = row["95% interval (ms)"], row["speedup vs one GPU"], row.get("repeats")
        cands = df[(df.strategy == strategy) & (df.world_size == int(gpus))]
        want = [(f"{r.step_time_median_s * 1e3:.1f}",
                 f"[{r.step_time_ci_low_s * 1e3:.1f}, {r.step_time_ci_high_s * 1e3:.1f}]",
                 {f"{v / r.step_time_median_s:.2f}x" for v in ref},
                 str(int(r.repeats_done)) if "repeats_done" in df.columns else None) for r in cands.itertuples()]
        assert any(m == median and i == interval and speedup in s and (reps is None or n == reps)
                   for m, i, s, n in want), (
            f"README row {strategy} x{gpus}: {median} {interval} {speedup} is not in docs/evidence/{name}: {want}")


def test_the_caption_states_what_the_evidence_records(block):
    name, _, body = block
    import json

    meta = json.loads((ROOT / "docs" / "evidence" / f"{name}.json").read_text())
    src = meta["sources"][0]
    for value in (src["gpus"], src["torch"], src["nccl"], src["created_utc"][:10]):
        assert value in body
    assert re.search(r"one run per cell|\d+ repeats per cell", body)
    assert f"docs/evidence/{name}." in body


def _png_text(path: Path) -> dict[str, str]:
    data, out, pos = path.read_bytes(), {}, 8
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos: pos + 8])
        chunk = data[pos + 8: pos + 8 + length]
        if kind == b"tEXt":
            key, _, value = chunk.partition(b"\0")
            out[key.decode()] = value.decode("latin-1")
        elif kind == b"zTXt":
            key, _, rest = chunk.partition(b"\0")
            out[key.decode()] = zlib.decompress(rest[1:]).decode("latin-1")
        pos += 12 + length
    return out


def test_the_figure_is_small_and_drawn_from_the_cited_table(block):
    name, _, body = block
    m = re.search(r"!\[[^\]]*\]\(([^)]+\.png)\)", body)
    assert m, "the result block has no figure"
    png = ROOT / m.group(1)
    assert png.stat().st_size < 80_000
    assert _png_text(png).get("Source", "").startswith(f"docs/evidence/{name}."), (
        "the figure was drawn from another table: run python -m tools.results_page")
