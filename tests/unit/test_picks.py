"""A finished run is read once and decided once; its decisions are kept in its folder and rendered
from there by the terminal and the report."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from bench.decide import picks
from bench.results import run as run_module
from bench.results.run import load_run

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "runs" / "check-h100-x4"


@pytest.fixture
def counted(monkeypatch):
    calls = {"recommend": 0, "open": 0}
    real_recommend, real_open = picks.recommend, run_module.Run.open.__func__

    def recommend(*a, **k):
        calls["recommend"] += 1
        return real_recommend(*a, **k)

    def open_(cls, d):
        calls["open"] += 1
        return real_open(cls, d)

    monkeypatch.setattr(picks, "recommend", recommend)
    monkeypatch.setattr(run_module.Run, "open", classmethod(open_))
    return calls


def test_the_end_of_a_run_reads_it_once_and_decides_once(tmp_path, counted, capsys):
    from bench.cli.main import main
    from bench.cli.run import after_run

    run = tmp_path / "run"
    shutil.copytree(FIXTURE, run)
    assert after_run(run, report=True) == 0
    assert counted == {"recommend": 1, "open": 1}
    said = capsys.readouterr().out
    stored = picks.load(load_run(run))
    assert stored is not None and [d.title for d in stored] == [d.title for d in picks.decide(load_run(run))]
    counted["recommend"] = 0
    assert main(["report", str(run)]) == 0
    assert counted["recommend"] == 0  # the report renders the stored decisions
    assert "recommendation:" in said


def test_stored_decisions_of_other_cells_are_made_again(tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(FIXTURE, run_dir)
    run = load_run(run_dir)
    picks.store(run, picks.decide(run))
    assert picks.load(run) is not None
    changed = load_run(run_dir)
    changed.cells.loc[0, "status"] = "failed"  # what a resume stopped half-way leaves: other cells
    assert picks.load(changed) is None
    (run_dir / picks.FILE).write_text('{"schema": 99, "decisions": []}')
    assert picks.load(run) is None and picks.of(run) == picks.decide(run)


def test_a_folder_that_cannot_take_the_decisions_is_decided_again_when_read(tmp_path, monkeypatch):
    run_dir = tmp_path / "run"
    shutil.copytree(FIXTURE, run_dir)
    run = load_run(run_dir)

    def full(*_a, **_k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Path, "write_text", full)
    assert picks.store(run, picks.decide(run)) is None
    monkeypatch.undo()
    assert not (run_dir / picks.FILE).exists() and picks.of(run) == picks.decide(run)
