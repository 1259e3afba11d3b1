"""The suite's own guard (tests/conftest.py): a test module that leaves a process running fails,
names it and kills it, whether the process is its child or an orphan of one (re-parented to pytest,
the child subreaper). Run on a copy of the conftest in an inner pytest."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil

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


def inner(tmp_path: Path, body: str, tag: str) -> subprocess.CompletedProcess:
    shutil.copy(CONFTEST, tmp_path / "conftest.py")
    (tmp_path / "test_inner.py").write_text(body.replace("TAG", tag))
    env = {**os.environ, "PARBENCH_TEST_LEFT_GRACE_S": "1", "PYTEST_ADDOPTS": ""}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
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


def test_a_module_that_leaves_a_child_or_an_orphan_fails_and_they_are_killed(tmp_path):
    tag = f"left-{os.getpid()}-{time.monotonic_ns()}"
    r = inner(tmp_path, LEAVES, tag)
    try:
        assert r.returncode == 1, r.stdout + r.stderr
        assert "left 2 process(es) running" in r.stdout, r.stdout
        assert f"{tag}-child" in r.stdout and f"{tag}-orphan" in r.stdout
        assert "2 passed, 1 error" in r.stdout  # the tests themselves passed; the module's teardown is the error
        assert running(tag) == []
    finally:
        for p in running(tag):
            p.kill()


def test_a_module_that_leaves_nothing_passes(tmp_path):
    r = inner(tmp_path, CLEAN, f"clean-{os.getpid()}")
    assert r.returncode == 0 and "1 passed" in r.stdout, r.stdout + r.stderr
