"""One verdict for one pair: `parbench compare` and the report's baseline section judge two run
folders with the same call and settings, and show the same verdict, medians and shift, the shift
labelled with what it is the shift of."""

from __future__ import annotations

import html as htmlmod
import io
import json
import re
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

from bench.cli.gate import print_compare
from bench.cli.main import main
from bench.gate.ciout import verdict_rows
from bench.gate.verdict import Gate, judge
from bench.results.store import RunWriter
from reports import build_report


def write_run(path: Path, times: dict[str, np.ndarray]) -> Path:
    """A run folder of gloo cells on CPU: strategy -> step times, one row of steps per repeat."""
    w = RunWriter(path)
    for cid, (strategy, t) in enumerate(times.items()):
        t = np.atleast_2d(t)
        med = float(np.median(np.median(t, axis=1)))
        w.add(dict(cell_id=cid, workload="mlp", strategy=strategy, backend="gloo", device="cpu",
                   world_size=1 if strategy == "single" else 2, status="ok", precision="fp32", global_batch=8,
                   role="reference" if strategy == "single" else "", parity_ok=True, step_time_median_s=med,
                   step_time_ci_low_s=med * 0.9, step_time_ci_high_s=med * 1.1, throughput_samples_s=8 / med,
                   repeats=len(t)),
              [dict(cell_id=cid, repeat=r, rank=k, step=s, phase="timed", step_time_s=float(t[r, s]), loss=1.0,
                    loss_weight=1.0) for r in range(len(t)) for s in range(t.shape[1]) for k in range(2)])
    (path / "meta.json").write_text(json.dumps({"run_id": path.name, "host": "h", "torch": "2.x", "config": {}}))
    return path


def aa_pair(tmp_path: Path) -> tuple[Path, Path]:
    """The same command twice on a shared CPU, one run a side: in the second, a neighbour doubled
    half of the ddp steps. Its pairwise shift (+56%) and its medians' change (+43%) are far apart,
    and on the steps alone the shift's interval clears the threshold."""
    rng = np.random.default_rng(2)
    x, y = 0.1 * np.exp(rng.normal(0, 0.3, 30)), 0.1 * np.exp(rng.normal(0, 0.3, 30))
    y = np.where(rng.random(30) < 0.5, 2 * y, y)
    quiet = np.random.default_rng(3)
    base = write_run(tmp_path / "base", {"single": 0.1 * np.exp(quiet.normal(0, 0.02, 30)), "ddp": x})
    cur = write_run(tmp_path / "cur", {"single": 0.1 * np.exp(quiet.normal(0, 0.02, 30)), "ddp": y})
    return base, cur


def page_rows(page: Path) -> dict[str, list[str]]:
    """The report's verdict table: cell name -> the texts of its row."""
    text = page.read_text()
    table = re.search(r"<table id='verdicts'>(.*?)</table>", text, re.S).group(1)
    rows = {}
    for tr in re.findall(r"<tr[^>]*>(.*?)</tr>", table, re.S)[1:]:
        cells = [htmlmod.unescape(re.sub(r"<[^>]+>", "", td)) for td in re.findall(r"<td[^>]*>(.*?)</td>", tr, re.S)]
        rows[cells[0]] = cells
    return rows


def md_rows(md: str) -> dict[str, list[str]]:
    rows = {}
    for line in md.splitlines():
        if line.startswith("| mlp/"):
            cells = [htmlmod.unescape(c.strip()) for c in line.strip("|").split(" | ")]
            rows[cells[0]] = cells
    return rows


def test_compare_and_the_report_give_one_verdict_for_one_pair(tmp_path):
    base, cur = aa_pair(tmp_path)
    md = tmp_path / "compare.md"
    code = main(["compare", str(base), str(cur), "--markdown", str(md)])
    judged = judge(cur, baseline=base).table.set_index("strategy")
    page = page_rows(build_report(cur, tmp_path / "report", baseline=base))
    cli = md_rows(md.read_text())
    ddp = "mlp/ddp/gloo/cpu/ws2"
    # one run a side cannot fail (run-to-run drift is not in its steps): noisy in both, exit 0
    assert code == 0 and judged.loc["ddp", "verdict"] == "noisy"
    assert page[ddp][1] == "noisy" and cli[ddp][1].endswith("noisy")
    for name in cli:  # verdict, medians, shift, what it is the shift of, noise floor, note: the same texts
        assert page[name][1:] == [cli[name][1].split()[-1], *cli[name][2:]], (page[name], cli[name])
    # the medians shown and their change agree with each other; the shift is labelled, not passed off
    # as the medians' change (here the two are far apart)
    r = judged.loc["ddp"]
    m = re.fullmatch(r"([\d.]+) → ([\d.]+) ms \(([+-][\d.]+)%\)", page[ddp][2])
    b_ms, c_ms, change = (float(x) for x in m.groups())
    assert (b_ms, c_ms) == (round(r["base_time_s"] * 1e3, 2), round(r["cur_time_s"] * 1e3, 2))
    assert change == pytest.approx(100 * (c_ms / b_ms - 1), abs=0.1)
    assert r["median_change"] == pytest.approx(r["cur_time_s"] / r["base_time_s"] - 1)
    assert abs(r["shift"] - r["median_change"]) > 0.05
    assert page[ddp][4] == "Hodges-Lehmann: 30 vs 30 pooled steps"
    assert "Hodges-Lehmann: the median of CURRENT / BASE over every pair of samples" in md.read_text()


def test_the_report_fails_what_compare_fails(tmp_path):
    """Five repeats a side, 20% slower: a regression in both, with the same shift."""
    rng = np.random.default_rng(1)
    base = write_run(tmp_path / "base", {"single": 0.1 * np.exp(rng.normal(0, 0.01, (5, 6))),
                                          "ddp": 0.1 * np.exp(rng.normal(0, 0.01, (5, 6)))})
    cur = write_run(tmp_path / "cur", {"single": 0.1 * np.exp(rng.normal(0, 0.01, (5, 6))),
                                        "ddp": 0.12 * np.exp(rng.normal(0, 0.01, (5, 6)))})
    md = tmp_path / "compare.md"
    assert main(["compare", str(base), str(cur), "--markdown", str(md)]) == 1
    page = page_rows(build_report(cur, tmp_path / "report", baseline=base))
    cli = md_rows(md.read_text())
    ddp = "mlp/ddp/gloo/cpu/ws2"
    assert page[ddp][1] == "regression" and cli[ddp][1].endswith("regression")
    assert page[ddp][2:] == cli[ddp][2:] and page[ddp][4] == "Hodges-Lehmann: 5 vs 5 repeat medians"
    # the terminal table holds the same texts
    buf = io.StringIO()
    print_compare(judge(cur, baseline=base).table, 0.05, Console(file=buf, width=400))
    row = next(line for line in buf.getvalue().splitlines() if " ddp " in line)
    for text in page[ddp][2:5]:
        assert text in row, (text, row)


def test_one_gate_for_every_caller():
    """The report's settings are compare's defaults: the threshold, alpha, test, and the rule that one
    run a side is at most noisy."""
    import argparse

    from bench.cli.gate import register

    p = argparse.ArgumentParser()
    register(p.add_subparsers())
    args = p.parse_args(["compare", "a", "b"])
    assert args.threshold is None and args.require_repeats and args.test == Gate().test
    assert Gate().threshold == 0.05 and Gate().require_repeats


def test_verdict_rows_label_an_untested_cell():
    import pandas as pd

    t = pd.DataFrame([{"workload": "w", "strategy": "s", "backend": "gloo", "device": "cpu", "world_size": 2,
                       "verdict": "broken", "base_time_s": 0.1, "cur_time_s": np.nan, "note": "now failed"}])
    v = verdict_rows(t).iloc[0]
    assert (v["medians"], v["shift"], v["basis"]) == ("100.00 → –", "–", "not tested")


def test_against_a_history_too(tmp_path):
    """With --history the report and compare test CURRENT against the same runs, and say so."""
    from bench.gate.history import add

    rng = np.random.default_rng(4)
    for i in range(5):
        run = write_run(tmp_path / f"r{i}", {"single": 0.1 * np.exp(rng.normal(0, 0.02, (3, 6))),
                                              "ddp": 0.1 * np.exp(rng.normal(0, 0.02, (3, 6)))})
        add(run, tmp_path / "hist", commit=f"c{i}")
    cur = write_run(tmp_path / "cur", {"single": 0.1 * np.exp(rng.normal(0, 0.02, (3, 6))),
                                        "ddp": 0.13 * np.exp(rng.normal(0, 0.02, (3, 6)))})
    md = tmp_path / "compare.md"
    assert main(["compare", "--history", str(tmp_path / "hist"), str(cur), "--markdown", str(md)]) == 1
    page = page_rows(build_report(cur, tmp_path / "report", history=tmp_path / "hist"))
    cli = md_rows(md.read_text())
    ddp = "mlp/ddp/gloo/cpu/ws2"
    assert page[ddp][1] == "regression" and page[ddp][2:] == cli[ddp][2:]
    assert page[ddp][4] == "mean log ratio: 5 history runs vs 3 repeat median(s)"


def edit_meta(run: Path, **fields) -> Path:
    meta = json.loads((run / "meta.json").read_text())
    (run / "meta.json").write_text(json.dumps({**meta, **fields}))
    return run


def dims_pair(tmp_path: Path) -> tuple[Path, Path]:
    """The same cells with the workload's dimensions changed: 1000 parameters, then 2000."""
    import pandas as pd
    import pyarrow.parquet as pq

    pair = aa_pair(tmp_path)
    for run, params in zip(pair, (1000, 2000)):
        for part in (run / "cells.parquet").glob("part-*.parquet"):
            pq.write_table(pq.read_table(part).set_column(
                pq.read_schema(part).get_field_index("params"), "params",
                [pd.array([params] * pq.read_metadata(part).num_rows, dtype="int64")]), part)
    return pair


@pytest.mark.parametrize("make, line", [
    (lambda tmp: (edit_meta(aa_pair(tmp)[0], torch="2.11.0+cu130"), edit_meta(tmp / "cur", torch="2.13.0")),
     "incomparable: torch 2.11.0+cu130 vs 2.13.0: measure both sides with one torch"),
    (lambda tmp: (edit_meta(aa_pair(tmp)[0], gpus=["NVIDIA H100 80GB HBM3"] * 2),
                  edit_meta(tmp / "cur", gpus=["NVIDIA H200"] * 2)),
     "incomparable: GPUs NVIDIA H100 80GB HBM3 vs NVIDIA H200: measure both sides on one GPU model"),
    (dims_pair, "incomparable: params 1000 vs 2000: measure both sides with one workload definition "
                "(the same --workloads and parbench)"),
], ids=["torch", "gpu", "workload-dims"])
def test_an_incomparable_pair_is_one_line_naming_the_difference_and_the_fix(make, line, tmp_path, capsys):
    """compare and report --baseline alike: exit 2 (nothing was compared), and no page is drawn."""
    base, cur = make(tmp_path)
    capsys.readouterr()
    for argv in (["compare", str(base), str(cur)], ["report", str(cur), "--baseline", str(base)]):
        assert main(argv) == 2, argv
        assert capsys.readouterr().err.splitlines() == [f"parbench: error: {line}"], argv
    assert not (cur / "report" / "index.html").exists()


def test_report_takes_compares_threshold_and_gives_its_verdict(tmp_path):
    """Five repeats a side, 10% slower: a regression at 5%, the same at 20%, in compare and the report."""
    rng = np.random.default_rng(6)
    base = write_run(tmp_path / "base", {"single": 0.1 * np.exp(rng.normal(0, 0.01, (5, 6))),
                                          "ddp": 0.1 * np.exp(rng.normal(0, 0.01, (5, 6)))})
    cur = write_run(tmp_path / "cur", {"single": 0.1 * np.exp(rng.normal(0, 0.01, (5, 6))),
                                        "ddp": 0.11 * np.exp(rng.normal(0, 0.01, (5, 6)))})
    ddp = "mlp/ddp/gloo/cpu/ws2"
    for threshold, verdict, code in (("5%", "regression", 1), ("20%", "same", 0)):
        md, out = tmp_path / f"compare-{threshold}.md", tmp_path / f"report-{threshold}"
        assert main(["compare", str(base), str(cur), "--threshold", threshold, "--markdown", str(md)]) == code
        assert main(["report", str(cur), "--baseline", str(base), "--threshold", threshold, "-o", str(out)]) == 0
        page, cli = page_rows(out / "index.html"), md_rows(md.read_text())
        assert page[ddp][1] == verdict and cli[ddp][1].endswith(verdict), (threshold, page[ddp], cli[ddp])
        assert page[ddp][2:] == cli[ddp][2:]
        assert f"Threshold {threshold[:-1]}.0% on step time" in (out / "index.html").read_text()
