"""tools/search_check.py and tools/search_table.py: the search's answer against a grid, and the
answers of an A/A pair, from hand-built run folders."""

import json
from pathlib import Path

import pandas as pd

from bench.results.run import Run
from tests.unit.test_search import row, searched_run
from tools import search_check, search_table


def one_gpu(rows: list[dict], searched_ids: list[int]) -> Run:
    run = searched_run(rows, searched_ids)
    run.meta["search"]["slots"] = ["gpt-tiny gloo x1"]
    return run


def test_the_answer_is_found_in_the_grid_and_set_against_its_fastest():
    default = one_gpu([row("single", 1, 100.0, cell_id=0), row("single", 1, 130.0, cell_id=1, gb=16, compile="on")],
                      [1])
    grid = Run(pd.DataFrame([row("single", 1, 128.0, cell_id=0, gb=16, compile="on"),
                             row("single", 1, 131.0, cell_id=1, gb=32, compile="on"),
                             row("single", 1, 90.0, cell_id=2, gb=16)]), path=Path("grid"))
    table, summary = search_check.check(default, [grid])
    assert summary["answer_in_grid_samples_s"] == 128.0 and summary["grid_fastest_samples_s"] == 131.0
    assert summary["answer_over_fastest"] == round(128 / 131, 4) and summary["fastest_vs_answer"] == "same"
    assert table["answer"].sum() == 1 and table["grid_fastest"].sum() == 1


def test_an_aa_pair_counts_the_same_and_the_decided_answers(tmp_path, capsys, monkeypatch):
    first = one_gpu([row("single", 1, 100.0, cell_id=0), row("single", 1, 150.0, cell_id=1, gb=16)], [1])
    second = one_gpu([row("single", 1, 100.0, cell_id=0), row("single", 1, 151.0, cell_id=1, gb=16)], [1])
    monkeypatch.setattr(search_table, "load_run", {"A": first, "B": second}.__getitem__)
    out = tmp_path / "aa.csv"
    assert search_table.main(["A", "B", "--csv", str(out)]) == 0
    t = pd.read_csv(out)
    assert list(t["run"]) == [1, 2] and t["decided"].all()
    assert "1 of 1 slots named the same configuration in both runs, 1 of them decided in both; 0 slots decided " \
           "differently" in capsys.readouterr().out
    answers = json.dumps(list(t["answer"].unique()))
    assert answers == '["single, compile off, checkpointing none, 16 samples per device"]'


def test_the_decisions_of_an_aa_pair_are_counted_alike(tmp_path, capsys, monkeypatch):
    """tools/decisions_table.py: one row per run and decision, and how many named the same answer."""
    from tests.unit.test_recommend import cell
    from tools import decisions_table

    def run(step):
        return Run(pd.DataFrame([cell("single", 1, 0.100, backend="gloo"), cell("ddp", 2, step, backend="gloo")]),
                   meta={"run_id": "r", "created_utc": "2026-12-03T19:18:18+00:00", "invoked_unix": 1796325497.0,
                         "updated_utc": "2026-12-03T19:22:07+00:00"})

    monkeypatch.setattr(decisions_table, "load_run", {"A": run(0.200), "B": run(0.210), "C": run(0.060)}.__getitem__)
    out = tmp_path / "d.csv"
    assert decisions_table.main(["A", "B", "--csv", str(out)]) == 0
    t = pd.read_csv(out)
    assert list(t["use"]) == ["one device", "one device"] and list(t["decided"]) == ["decided", "decided"]
    assert t["wall_s"].iloc[0] == 230.0 and t["speedup"].iloc[0] == 0.5
    assert "1 of 1 decisions named the same answer in both runs, 1 of them decided in both" in capsys.readouterr().out
    assert decisions_table.main(["A", "C"]) == 0
    assert "0 of 1 decisions named the same answer" in capsys.readouterr().out
