"""noxfile.py's sessions, called with a fake session: what the bench session installs and says."""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[2]
nox = pytest.importorskip("nox", reason="nox is not installed (the dev extra has it)")


@functools.cache  # once: nox registers each session by name when the file is executed
def load_noxfile():
    spec = importlib.util.spec_from_file_location("parbench_noxfile", ROOT / "noxfile.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class FakeSession:
    """What the sessions use of nox.Session; ``run`` raises ``fail`` after recording the call."""

    def __init__(self, fail: BaseException | None = None):
        self.events: list[tuple] = []
        self.posargs = ["--steps", "3"]
        self.virtualenv = SimpleNamespace(location="/v/.nox/bench")
        self.fail = fail

    def install(self, *args, **kw):
        self.events.append(("install", args))

    def run(self, *args, **kw):
        self.events.append(("run", args))
        if self.fail is not None:
            raise self.fail

    def log(self, message, *args, **kw):
        self.events.append(("log", message))


ACTIVATE = "source /v/.nox/bench/bin/activate"


@pytest.mark.parametrize("fail", [None, nox.command.CommandFailed("Returned code 1"), KeyboardInterrupt()],
                         ids=["ok", "failed", "interrupted"])
def test_bench_says_how_to_get_parbench_on_path_last(fail, monkeypatch):
    """After the run's own last lines, also when the run fails or is interrupted (the error goes on)."""
    monkeypatch.delenv("PARBENCH_TORCH_INDEX", raising=False)
    session = FakeSession(fail)
    if fail is None:
        load_noxfile().bench(session)
    else:
        with pytest.raises(type(fail)):
            load_noxfile().bench(session)
    kinds = [e[0] for e in session.events]
    assert kinds == ["install", "install", "run", "log"], session.events
    assert session.events[2][1] == ("parbench", "run", "--report", "--steps", "3")
    assert ACTIVATE in session.events[-1][1]
