"""noxfile.py's sessions, called with a fake session: what the bench session installs and says."""

from __future__ import annotations

import ast
import functools
import importlib.util
import re
import sys
from importlib.metadata import packages_distributions
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


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_what_export_imports_is_installed_by_the_bench_session(monkeypatch):
    """The bench session installs parbench without extras: every package that
    `parbench export --format pytest-benchmark` imports must be a core dependency."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib

    monkeypatch.delenv("PARBENCH_TORCH_INDEX", raising=False)
    session = FakeSession()
    load_noxfile().bench(session)
    assert session.events[1] == ("install", ("-e", "."))  # no extra
    core = {_norm(re.match(r"[A-Za-z0-9._-]+", d).group()) for d in
            tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]}
    source = (ROOT / "bench" / "gate" / "ciout.py").read_text()
    func = next(n for n in ast.walk(ast.parse(source)) if getattr(n, "name", "") == "pytest_benchmark_json")
    imported = {(n.module if isinstance(n, ast.ImportFrom) else a.name).split(".")[0]
                for n in ast.walk(func) if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}
    third_party = sorted(m for m in imported if m not in sys.stdlib_module_names and m != "bench")
    assert "pytest_benchmark" in third_party  # what export needs today; any other import is checked as well
    dists = packages_distributions()
    for module in third_party:
        assert {_norm(d) for d in dists[module]} & core, f"{module} is not a core dependency in pyproject.toml"
