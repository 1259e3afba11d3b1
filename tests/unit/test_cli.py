"""The CLI's contract with users: one-line errors with exit code 2, no traceback."""

import os

import pytest

from bench.cli.main import main


@pytest.mark.parametrize("args, needle", [
    (["run", "--backends", "mpi"], "backend 'mpi' unknown"),
    (["run", "--workloads", "nope"], "unknown workload 'nope'"),
    (["run", "--strategies", "zero3"], "unknown strategy 'zero3'"),
    (["run", "--workloads", "no_such_pkg:f"], "cannot import 'no_such_pkg'"),
    (["run", "--config", "/no/such.toml"], "config '/no/such.toml' not found"),
    (["report", "/no/such/run"], "not a parbench run folder"),
    (["compare", "/a", "/b", "--threshold", "x"], "threshold 'x'"),
    (["report", "/no/such/run", "--threshold", "5%"], "--threshold 5% judges a comparison; add --baseline RUN"),
    (["report", "/no/such/run", "--baseline", "/no/base", "--threshold", "x"], "threshold 'x'"),
])
def test_bad_input_is_one_line_exit_2(args, needle, tmp_path, capsys):
    """In this process (the command's own code path; tests/unit/test_bad_input.py runs a few cases
    through the command in a process of its own)."""
    capsys.readouterr()
    try:
        code = main([*args, *(["--out", str(tmp_path)] if args[0] == "run" else [])])
    except SystemExit as e:  # argparse's exits count as codes
        code = e.code
    err = capsys.readouterr().err
    assert code == 2, err
    assert needle in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not list(tmp_path.iterdir())  # nothing was started


def test_list_names_everything(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for name in ("mlp", "convnet", "gpt-tiny", "gpt-200m", "single", "dataparallel", "ddp", "allreduce-bucketed"):
        assert name in out


def _fake_groups(monkeypatch, seen: list[int], stop_after: int | None = None):
    """launch.run_group replaced by one that writes a failed row per cell without starting torchrun,
    and raises SIGTERM's Interrupted after ``stop_after`` cells (as the signal handler would)."""
    import signal as _signal

    from bench.results.rows import failure_row
    from bench.runtime.signals import Interrupted
    from bench.train import launcher as launch

    def fake(g, gid, ctx, again=None):
        ctx.starts.append({"group": g.label, "attempt": 1, "fake": True})
        for c in g.cells:
            if stop_after is not None and len(seen) >= stop_after:
                raise Interrupted(_signal.SIGTERM)
            seen.append(c.cell_id)
            ctx.writer.add(failure_row(c, status="failed", reason="fake"))

    monkeypatch.setattr(launch, "run_group", fake)


def test_sigterm_then_resume_runs_only_the_missing_cells(tmp_path, monkeypatch, capsys):
    import json

    from bench.results.store import read_table

    args = ["run", "--out", str(tmp_path), "--device", "cpu", "--workloads", "mlp", "--strategies", "ddp,fsdp",
            "--world-sizes", "1,2", "--sample-hz", "0", "--no-progress"]
    first: list[int] = []
    _fake_groups(monkeypatch, first, stop_after=2)
    assert main(args) == 143
    err = capsys.readouterr().err
    assert "interrupted by SIGTERM" in err
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert f"parbench run --resume {run_dir}" in err  # the folder by name (with --no-progress nothing else says it)
    meta = json.loads((run_dir / "meta.json").read_text())
    assert meta["interrupted"] is True and meta["status"] == "interrupted by SIGTERM"
    assert sorted(read_table(run_dir, "cells")["cell_id"]) == sorted(first)

    second: list[int] = []
    _fake_groups(monkeypatch, second)
    # every cell of the fake groups fails: the resumed run completes, and says that nothing was measured
    assert main(["run", "--resume", str(run_dir), "--no-progress"]) == 1
    assert "parbench run: no cell was measured" in capsys.readouterr().err
    assert second and not set(first) & set(second)  # only what the first run had not finished
    ids = read_table(run_dir, "cells")["cell_id"].tolist()
    assert len(ids) == len(set(ids)) and set(first) | set(second) <= set(ids)
    meta = json.loads((run_dir / "meta.json").read_text())
    assert meta["status"] == "complete" and meta["interrupted"] is False and meta["resumed"] == sorted(first)
    assert (run_dir / "work" / "resume1").is_dir()
    # the interrupted run's start-up records are kept, the resumed run's follow them
    groups = [g["group"] for g in meta["group_starts"]]
    assert groups == ["gloo x1", "gloo x1", "gloo x2"], groups  # first run: 1 group; the resume: 2


def test_disk_full_mid_run_stops_with_one_line_and_keeps_finished_cells(tmp_path, monkeypatch, capsys):
    """ENOSPC on the second cell's part: exit 2, one line naming the fix, the first cell kept, no
    temporary file, meta.json says why the run stopped."""
    import errno
    import json

    import pyarrow.parquet as pq

    from bench.results.rows import failure_row
    from bench.results.store import read_table
    from bench.train import launcher as launch

    real = pq.write_table

    written: list[int] = []

    def fake(g, gid, ctx, again=None):
        ctx.starts.append({"group": g.label, "attempt": 1, "fake": True})
        for c in g.cells:
            if written:
                def full(table, where, *a, **k):
                    open(where, "wb").write(b"PAR1")
                    raise OSError(errno.ENOSPC, "No space left on device")

                monkeypatch.setattr(pq, "write_table", full)
            ctx.writer.add(failure_row(c, status="failed", reason="fake"))
            written.append(c.cell_id)

    monkeypatch.setattr(launch, "run_group", fake)
    code = main(["run", "--out", str(tmp_path), "--device", "cpu", "--workloads", "mlp", "--strategies", "ddp",
                 "--world-sizes", "1,2", "--sample-hz", "0", "--no-progress"])
    monkeypatch.setattr(pq, "write_table", real)
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "No space left on device" in err and "--resume" in err
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert (read_table(run_dir, "cells")["status"] == "failed").sum() == 1
    assert not list(run_dir.rglob("*.tmp"))
    assert json.loads((run_dir / "meta.json").read_text())["status"].startswith("stopped: cannot write")


TORCHRUN_LOG = """\
[rank0]: RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:4242
E1126 10:06:31.080000 27500 api.py:1002] failed (exitcode: -9) local_rank: 1 (pid: 27521) of binary: python
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
=======================================================
bench.train.worker FAILED
-------------------------------------------------------
Failures:
[1]:
  time      : 2026-11-26_10:06:31
  rank      : 0 (local_rank: 0)
  exitcode  : 1 (pid: 27519)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
-------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-26_10:06:30
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 27521)  (SIGKILL)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 27521
=======================================================
"""


def test_crash_reason_names_the_root_cause_rank_its_signal_and_a_real_error_line(tmp_path):
    from bench.runtime.crash import crash_reason, exit_text

    log = tmp_path / "g0-a1.log"
    log.write_text(TORCHRUN_LOG)
    prefix = str(tmp_path / "g0-a1")
    (tmp_path / "g0-a1-r0.err").write_text("RuntimeError: [gloo] Connection closed by peer [127.0.0.1]:4242\n")
    reason = crash_reason(prefix, log, 1, 2)
    assert reason.startswith("rank 1 exited with signal 9 (SIGKILL): no error line from it; rank 0: RuntimeError")
    assert "To enable traceback" not in reason and "error_file" not in reason
    (tmp_path / "g0-a1-r1.err").write_text("first\nValueError: the last line [/x]\n")
    assert crash_reason(prefix, log, 1, 2) == "rank 1 exited with signal 9 (SIGKILL): ValueError: the last line [/x]"
    # the agent itself killed: no summary in its log, the ranks' own lines say what happened
    log.write_text("W1126 starting\n")
    assert crash_reason(prefix, log, -9, 2).startswith("torchrun exited with signal 9 (SIGKILL); rank 0: ")
    assert exit_text(3) == "exit code 3" and exit_text(-15) == "signal 15 (SIGTERM)"


def test_a_root_cause_that_lost_its_peer_blames_the_peer(tmp_path):
    """torchrun can observe the rank that lost its peer first (the same second): the rank the
    Failures list names, interrupted mid-collective, is the cause."""
    from bench.runtime.crash import crash_reason, failures

    swapped = TORCHRUN_LOG.replace("rank      : 0 (local_rank: 0)", "rank      : X").replace(
        "rank      : 1 (local_rank: 1)", "rank      : 0 (local_rank: 0)").replace("rank      : X", "rank      : 1")
    swapped = swapped.replace("exitcode  : 1 (pid: 27519)", "exitcode  : -2 (pid: 27519)").replace(
        "exitcode  : -9 (pid: 27521)  (SIGKILL)", "exitcode  : 1 (pid: 27521)")
    log = tmp_path / "g0-a1.log"
    log.write_text(swapped)
    prefix = str(tmp_path / "g0-a1")
    (tmp_path / "g0-a1-r0.err").write_text("RuntimeError: [gloo] Connection closed by peer [127.0.0.1]:4242\n")
    (tmp_path / "g0-a1-r1.err").write_text("KeyboardInterrupt\n")
    assert failures(swapped) == [(1, -2)]
    assert crash_reason(prefix, log, 1, 2) == "rank 1 exited with signal 2 (SIGINT): KeyboardInterrupt"
    (tmp_path / "g0-a1-r0.err").write_text("ValueError: its own error\n")  # a cause of its own: it stays
    assert crash_reason(prefix, log, 1, 2) == "rank 0 exited with exit code 1: ValueError: its own error"


def test_summary_and_compare_print_brackets_verbatim(tmp_path):
    """Names and reasons with rich markup in them are printed as they are, never interpreted."""
    import io

    import pandas as pd
    from rich.console import Console

    from bench.cli.gate import print_compare
    from bench.cli.summary import print_summary
    from bench.results.store import RunWriter

    d = tmp_path / "run"
    RunWriter(d).append("cells", [{"cell_id": 0, "workload": "w[/x]", "strategy": "s[bold]", "backend": "gloo",
                                   "world_size": 2, "status": "failed", "reason": "RuntimeError: [/x] err == 0."}])
    buf = io.StringIO()
    print_summary(d, Console(file=buf, width=300))
    assert "w[/x]" in buf.getvalue() and "failed: RuntimeError: [/x] err == 0." in buf.getvalue()
    table = pd.DataFrame([{"workload": "w[/x]", "strategy": "[bold]s", "backend": "gloo", "world_size": 2,
                           "base_time_s": 0.002, "cur_time_s": 0.001, "noise_floor": 0.01, "verdict": "[red]x",
                           "note": "[bold]n"}])
    buf = io.StringIO()
    print_compare(table, 0.05, Console(file=buf, width=300))
    assert "[bold]s" in buf.getvalue() and "[red]x" in buf.getvalue() and "[bold]n" in buf.getvalue()


def test_the_budget_line_times_this_invocation_and_never_fails_a_finished_run(tmp_path, capsys):
    """The line times this invocation (a resumed run's, not the first run's created_utc, hours
    before), and odd meta.json contents give at most a line, never an exception after a complete run."""
    import json

    from bench.cli.run import print_budget_use
    from bench.results.store import RunWriter

    run = tmp_path / "r"
    RunWriter(run).add({"cell_id": 0, "status": "ok", "reason": ""})
    base = {"config": {"budget": "10m"}, "created_utc": "2026-11-27T10:00:00+00:00",
            "updated_utc": "2026-11-27T14:05:00+00:00", "invoked_unix": 1_795_788_000.0,  # 14:00 UTC
            "resumed": [3], "group_starts": [{"group": "gloo x1", "launched_unix": 1_795_773_900.0, "start_s": 9.0},
                                             {"group": "gloo x2", "launched_unix": 1_795_788_010.0, "start_s": 4.0}]}
    (run / "meta.json").write_text(json.dumps(base))
    print_budget_use(run)
    line = capsys.readouterr().out.strip()
    assert line.startswith("budget 10m: the run took 300 s (50%) since its resume") and \
        "1 process group start-ups took 4 s" in line, line
    for odd in ({**base, "config": None}, {**base, "config": {"budget": "abc"}}, {**base, "created_utc": "x",
                "invoked_unix": None}, {**base, "group_starts": [{"start_s": None}]}, [1, 2]):
        (run / "meta.json").write_text(json.dumps(odd))
        print_budget_use(run)  # no exception; at most a line
    capsys.readouterr()


def test_version_names_parbench_and_torch_and_exits_0(capsys):
    """`parbench --version`: the installed parbench (package metadata) and the torch it runs with."""
    from importlib.metadata import version

    import torch

    import bench

    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert bench.__version__ == version("parbench")
    assert capsys.readouterr().out == f"parbench {bench.__version__} (torch {torch.__version__})\n"


def test_version_of_a_source_tree_that_was_never_installed_is_pyprojects(monkeypatch, tmp_path):
    import importlib.metadata
    from pathlib import Path

    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib

    import bench

    def not_installed(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", not_installed)
    pyproject = Path(bench.__file__).resolve().parents[1] / "pyproject.toml"
    assert bench.installed_version() == tomllib.loads(pyproject.read_text())["project"]["version"]
    other = tmp_path / "pyproject.toml"  # the [project] table's version, not another table's
    other.write_text('[tool.x]\nversion = "9"\n\n[project]\nname = "parbench"\nversion = "1.2.3"\n')
    assert bench.pyproject_version(other) == "1.2.3"
    assert bench.pyproject_version(tmp_path / "none.toml") == "unknown"


def test_meta_json_records_the_parbench_version():
    import bench
    from bench.results.store import machine_meta

    assert machine_meta()["parbench"] == bench.__version__


def test_a_wide_table_outside_a_terminal_takes_columns_when_set(monkeypatch):
    from bench.cli.common import table_console

    monkeypatch.setattr("sys.stdout.isatty", lambda: False)
    monkeypatch.delenv("COLUMNS", raising=False)
    assert table_console().width == 160  # pytest captures stdout: not a terminal
    monkeypatch.setenv("COLUMNS", "100")
    assert table_console().width == 100
    monkeypatch.setenv("COLUMNS", "wide")
    assert table_console(120).width == 120


def test_the_recorded_command_reads_as_parbench_however_it_was_started():
    from bench.results.store import command_line

    assert command_line(["/x/venv/bin/parbench", "run", "--repeats", "3"]) == ["parbench", "run", "--repeats", "3"]
    assert command_line(["/work/main/bench/__main__.py", "compare", "a", "b"]) == ["parbench", "compare", "a", "b"]
    assert command_line(["tools/run_thing.py", "x"]) == ["tools/run_thing.py", "x"]


def test_the_run_command_adds_the_model_sized_beyond_one_gpu_on_several_gpus_only(monkeypatch):
    from bench.cli import run
    from bench.cli.common import Parser
    from bench.plan import memory

    parser = Parser(prog="parbench")
    run.register(parser.add_subparsers(dest="cmd"))
    monkeypatch.setattr(memory, "beyond_one_device", lambda device="cuda": "gpt-20b[n_layer=24]")
    default = parser.parse_args(["run"])
    assert run.run_config(default, 4).matrix.workloads == ["gpt-200m[global_batch=64]", "gpt-20b[n_layer=24]"]
    assert run.run_config(default, 1).matrix.workloads == ["gpt-200m[global_batch=64]"]
    on_cpu = run.run_config(parser.parse_args(["run", "--device", "cpu"]), 4)
    assert on_cpu.matrix.workloads == ["mlp", "gpt-tiny", "convnet"]
    mine = run.run_config(parser.parse_args(["run", "--global-batch", "32"]), 4)
    assert (mine.matrix.workloads, mine.matrix.global_batch) == (["gpt-200m[global_batch=64]"], 32)


LIGHT_PROBE = """
import contextlib, io, sys
from bench.cli.main import main
with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
    try:
        code = main(sys.argv[1:])
    except SystemExit as e:
        code = e.code
print(code, *sorted(m for m in ("torch", "pandas", "scipy", "matplotlib", "pyarrow") if m in sys.modules))
"""


@pytest.mark.parametrize("argv", [["--help"], ["run", "--help"], ["compare", "--help"], ["run", "--bogus"],
                                  ["run", "--device", "cpu", "--steps", "-1"],
                                  ["run", "--device", "cpu", "--budget", "xx"],
                                  ["comm", "--help"], ["serve", "--help"], ["list"]], ids=" ".join)
def test_help_list_and_bad_settings_import_no_torch_pandas_scipy_or_matplotlib(argv):
    """They answer at once: each of those takes seconds to import on a loaded 2-core machine."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", LIGHT_PROBE, *argv], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    code, *heavy = out.stdout.split()
    assert code in ("0", "2") and heavy == [], (argv, out.stdout, out.stderr[-500:])


def test_a_run_where_no_cell_was_measured_exits_1_with_why(tmp_path, capsys):
    from bench.cli.run import nothing_measured
    from bench.results.store import RunWriter

    row = {"workload": "mlp", "backend": "gloo", "world_size": 2}
    failed = RunWriter(tmp_path / "failed")
    failed.append("cells", [{**row, "cell_id": 0, "strategy": "ddp", "status": "failed", "reason": "boom"},
                            {**row, "cell_id": 1, "strategy": "fsdp", "status": "timeout", "reason": ""},
                            {**row, "cell_id": 2, "strategy": "tensor", "status": "skipped", "reason": "x"}])
    failed.close()
    assert nothing_measured(tmp_path / "failed") == 1
    err = capsys.readouterr().err.strip()
    assert err == ("parbench run: no cell was measured: 1 failed, 1 timeout; the first, mlp ddp x2: boom; exit 1")
    ok = RunWriter(tmp_path / "ok")
    ok.append("cells", [{**row, "cell_id": 0, "strategy": "ddp", "status": "failed", "reason": "boom"},
                        {**row, "cell_id": 1, "strategy": "single", "status": "ok", "reason": ""}])
    ok.close()
    skipped = RunWriter(tmp_path / "skipped")  # nothing ran: the summary says why each was skipped
    skipped.append("cells", [{**row, "cell_id": 0, "strategy": "ddp", "status": "skipped", "reason": "x"}])
    skipped.close()
    assert nothing_measured(tmp_path / "ok") == 0 and nothing_measured(tmp_path / "skipped") == 0


def test_the_budget_line_counts_the_repeats_the_deadline_cut(tmp_path, capsys):
    """--repeats 1000 --budget 1m did 135 repeats and said "0 cut by the deadline"."""
    import json

    from bench.cli.run import print_budget_use
    from bench.results.store import RunWriter

    w = RunWriter(tmp_path / "run")
    w.append("cells", [{"cell_id": i, "workload": "mlp", "strategy": s, "backend": "gloo", "world_size": n,
                        "status": "ok", "repeats": 1000, "repeats_done": 135} for i, (s, n) in
                       enumerate([("single", 1), ("ddp", 2)])])
    w.close()
    (tmp_path / "run" / "meta.json").write_text(json.dumps({
        "config": {"budget": "60s"}, "created_utc": "2026-12-02T00:00:00+00:00",
        "updated_utc": "2026-12-02T00:01:00+00:00"}))
    print_budget_use(tmp_path / "run")
    out = capsys.readouterr().out
    assert "2 cells measured, 0 cut by the deadline, 1730 repeats asked for but cut by it" in out, out
