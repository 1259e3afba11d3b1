"""The suite's own guard (tests/conftest.py): a test module that leaves a process running fails,
names it and kills it, whether the process is its child or an orphan of one (re-parented to pytest,
the child subreaper). Run on a copy of the conftest in one inner pytest over two modules: one that
leaves a child and an orphan, one whose child exits (an inner pytest costs a Python and torch start)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

CONFTEST = Path(__file__).resolve().parents[1] / "conftest.py"

LEAVES = textwrap.dedent("""
    import subprocess, sys

    def test_leaves_a_child(tmp_path):
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)  # TAG-child"])

    def test_leaves_an_orphan():
        # the shell exits at once; its own child, in a session of its own, is re-parented to pytest
        subprocess.run(["bash", "-c", "setsid python3 -c 'import time; time.sleep(300)  # TAG-orphan' &"],
                       check=True)
""")

CLEAN = textwrap.dedent("""
    import subprocess, sys

    def test_waits_for_its_child():
        subprocess.run([sys.executable, "-c", "pass"], check=True)
""")


def inner(tmp_path: Path, modules: dict[str, str]) -> subprocess.CompletedProcess:
    """An inner pytest over ``modules`` (file name -> body) with the suite's conftest; short summary
    lines for errors and failures."""
    shutil.copy(CONFTEST, tmp_path / "conftest.py")
    for name, body in modules.items():
        (tmp_path / name).write_text(body)
    env = {**os.environ, "PARBENCH_TEST_LEFT_GRACE_S": "1", "PYTEST_ADDOPTS": ""}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-rfE", "-p", "no:cacheprovider", "-o", "addopts=",
                           str(tmp_path)], cwd=tmp_path, capture_output=True, text=True, env=env, timeout=120)


def running(tag: str) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if any(tag in a for a in p.info["cmdline"] or []) and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.Error:
            pass
    return out


@pytest.fixture(scope="module")
def inner_run(tmp_path_factory) -> tuple[subprocess.CompletedProcess, str]:
    """(the inner pytest's result, the tag in its processes' command lines)."""
    tag = f"left-{os.getpid()}-{time.monotonic_ns()}"
    try:
        yield inner(tmp_path_factory.mktemp("inner"), {"test_clean.py": CLEAN.replace("TAG", tag),
                                                        "test_leaves.py": LEAVES.replace("TAG", tag)}), tag
    finally:
        for p in running(tag):
            p.kill()


def test_a_module_that_leaves_a_child_or_an_orphan_fails_and_they_are_killed(inner_run):
    r, tag = inner_run
    assert r.returncode == 1, r.stdout + r.stderr
    assert "test_leaves left 2 process(es) running" in r.stdout, r.stdout
    assert f"{tag}-child" in r.stdout and f"{tag}-orphan" in r.stdout
    # every test passed; the leaving module's teardown is the one error
    assert "3 passed, 1 error" in r.stdout, r.stdout
    assert running(tag) == []


def test_a_module_that_leaves_nothing_passes(inner_run):
    r, _ = inner_run
    summary = [line for line in r.stdout.splitlines() if line.startswith(("ERROR ", "FAILED "))]
    assert len(summary) == 1 and "test_leaves.py" in summary[0], r.stdout + r.stderr
    assert "test_clean" not in r.stdout.split("short test summary info")[-1], r.stdout
