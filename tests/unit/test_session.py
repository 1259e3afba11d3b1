"""The run lifecycle every mode shares (bench.results.session): the status words, meta.json from
running to its final status, the end hooks however the run ends, and training's use of it."""

from __future__ import annotations

import json
import signal

import pytest

from bench.core.errors import UserError
from bench.results.session import COMPLETE, FAILED, RunSession, Samplers, interrupted, status_of
from bench.runtime.signals import Interrupted


def test_status_words_for_every_way_a_run_ends():
    assert status_of(None) == COMPLETE == "complete"
    assert status_of(KeyboardInterrupt()) == "interrupted by SIGINT"
    assert status_of(Interrupted(signal.SIGTERM)) == "interrupted by SIGTERM"
    assert status_of(UserError("disk full")) == "stopped: disk full"
    assert status_of(RuntimeError("boom")) == FAILED == "failed"
    assert interrupted("interrupted by SIGHUP") and not interrupted("stopped: interrupted by nobody")


def _meta(d):
    return json.loads((d / "meta.json").read_text())


def test_meta_json_from_running_to_its_final_status(tmp_path):
    seen: list[str] = []
    session = RunSession(tmp_path, {"x": 1}, fields=lambda status: {"mode": "test", "phase": status},
                         samplers=Samplers(0, False))
    session.at_end(seen.append)
    session.after_complete(lambda: seen.append("merged"))
    with session:
        session.begin()
        first = _meta(tmp_path)
        assert first["status"] == "running" and first["phase"] == "running" and "interrupted" not in first
    meta = _meta(tmp_path)
    assert meta["status"] == "complete" and meta["interrupted"] is False and meta["phase"] == "complete"
    assert meta["config"] == {"x": 1} and meta["mode"] == "test"
    assert seen == ["complete", "merged"]


@pytest.mark.parametrize("exc, status", [(Interrupted(signal.SIGTERM), "interrupted by SIGTERM"),
                                         (UserError("no room"), "stopped: no room"), (ValueError("x"), "failed")])
def test_a_stopped_run_says_why_and_skips_what_follows_a_complete_one(tmp_path, exc, status):
    seen: list[str] = []
    session = RunSession(tmp_path, {})
    session.at_end(seen.append)
    session.after_complete(lambda: seen.append("merged"))
    with pytest.raises(type(exc)) as got:
        with session:
            session.begin()
            raise exc
    meta = _meta(tmp_path)
    assert meta["status"] == status and meta["interrupted"] is status.startswith("interrupted")
    assert seen == [status]
    assert getattr(got.value, "run_dir", None) == (tmp_path if isinstance(exc, KeyboardInterrupt) else None)


def test_a_run_that_stops_before_it_began_writes_no_meta_but_runs_its_end_hooks(tmp_path):
    seen: list[str] = []
    session = RunSession(tmp_path, {})
    session.at_end(seen.append)
    with pytest.raises(UserError), session:
        raise UserError("cannot create the traces folder")
    assert not (tmp_path / "meta.json").exists()
    assert seen == ["stopped: cannot create the traces folder"]


def test_a_final_meta_json_that_cannot_be_written_is_raised_only_after_a_complete_run(tmp_path, monkeypatch):
    import bench.results.session as ses

    def full(*_a, **_kw):
        raise UserError("cannot write meta.json (No space left on device)")

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with pytest.raises(UserError, match="No space left"), RunSession(tmp_path / "a", {}) as session:
        session.begin()
        monkeypatch.setattr(ses, "write_meta", full)
    monkeypatch.undo()
    with pytest.raises(UserError, match="the cause"), RunSession(tmp_path / "b", {}) as session:
        session.begin()
        monkeypatch.setattr(ses, "write_meta", full)
        raise UserError("the cause")  # what stopped the run comes first, and alone
    assert session.status == "stopped: the cause"


def test_a_training_run_on_several_nodes_tells_them_when_its_traces_folder_fails(tmp_path):
    """The coordinator is closed whatever stops node 0 before its groups run (here: the traces
    folder cannot be made), with the status the run stopped with."""
    from bench.core.config import build_config
    from bench.results.store import RunWriter
    from bench.train import launcher
    from bench.train.context import RunPlan

    class Coord:
        closed: list[str] = []

        def accept(self, _run_dir):
            pass

        def close(self, status):
            self.closed.append(status)

    cfg = build_config(toml=None, flags={"device": "cpu", "workloads": "mlp", "strategies": "single",
                                         "world_sizes": "1", "sample_hz": 0, "trace": True}, gpus=0)
    writer = RunWriter(tmp_path / "run")
    (tmp_path / "run" / "traces").write_text("a file where the folder goes")
    coord = Coord()
    with pytest.raises(UserError):
        launcher._record(cfg, RunPlan(cells=[]), writer, tmp_path / "run" / "work", lambda _p: None, coord,
                         {"group_starts": []})
    assert len(coord.closed) == 1 and coord.closed[0].startswith("stopped: "), coord.closed
    assert not (tmp_path / "run" / "meta.json").exists()
    RunWriter(tmp_path / "run", resume=True).close()  # the writer's lock was released
