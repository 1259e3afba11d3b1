"""The CLI's contract with users: one-line errors with exit code 2, no traceback."""

import subprocess
import sys

import pytest

from bench.cli import main


def cli(*args):
    return subprocess.run([sys.executable, "-m", "bench.cli", *args], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("args, needle", [
    (["run", "--backends", "mpi"], "backend 'mpi' unknown"),
    (["run", "--workloads", "nope"], "unknown workload 'nope'"),
    (["run", "--strategies", "zero3"], "unknown strategy 'zero3'"),
    (["run", "--workloads", "no_such_pkg:f"], "cannot import 'no_such_pkg'"),
    (["run", "--config", "/no/such.toml"], "config '/no/such.toml' not found"),
    (["report", "/no/such/run"], "not a parbench run folder"),
    (["compare", "/a", "/b", "--threshold", "x"], "threshold 'x'"),
])
def test_bad_input_is_one_line_exit_2(args, needle, tmp_path):
    r = cli(*args, *(["--out", str(tmp_path)] if args[0] == "run" else []))
    assert r.returncode == 2, r.stderr
    assert needle in r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not list(tmp_path.iterdir())  # nothing was started


def test_list_names_everything(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for name in ("mlp", "convnet", "gpt-tiny", "gpt-200m", "single", "dataparallel", "ddp", "allreduce-bucketed"):
        assert name in out
