"""Fault cases of `parbench run` beyond bad flags (tests/unit/test_bad_input.py) and in-rank faults
(tests/distributed/test_faults.py): a full disk, a user workload that never returns, the launcher
killed at each moment of a run, a stop signal while the report is written, a machine loaded far
past its cores. In-process cases run in the default suite; the others are ``faults``-marked."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import tests.helpers  # noqa: F401 - imported once here: a factory's own time is what its case measures
from bench.results.lock import LOCK_NAME
from tests.faults.harness import Case, check, mounted_tmpfs, params

REPO = str(Path(__file__).resolve().parents[2])
#: the smallest real run: one workload, few steps, no profiling, no adaptive loops, no progress bar
TINY = ["--device", "cpu", "--backends", "gloo", "--workloads", "mlp", "--steps", "2", "--warmup", "1",
        "--profile-steps", "0", "--target-ci", "0", "--sample-hz", "0", "--no-progress"]
PATH_ENV = {"PYTHONPATH": REPO, "OMP_NUM_THREADS": "1"}  # tests.helpers for a process started in {tmp}


def _runs(tmp: Path, out: str = "out") -> list[Path]:
    return sorted(d for d in (tmp / out).glob("*") if (d / "meta.json").is_file()) if (tmp / out).is_dir() else []


def _rows_whole(tmp: Path, out: str = "out", *, every_cell_ok: bool = True) -> list[str]:
    """What is lost or left half-done in the case's one run folder: rows that do not read back,
    cells that did not finish (``every_cell_ok``), scratch copies and temporary files."""
    from bench.results.run import load_run

    runs = _runs(tmp, out)
    if len(runs) != 1:
        return [f"{len(runs)} run folders under {tmp / out}"]
    lost = [f"scratch {p.name}" for p in runs[0].glob(".*") if p.name != LOCK_NAME]
    lost += [f"temporary {p}" for p in runs[0].rglob("*.tmp")]
    if not (runs[0] / "cells.parquet").exists():
        return lost
    try:
        cells, _, _ = load_run(runs[0])
    except Exception as e:  # noqa: BLE001 - a run folder that does not read is the loss
        return [*lost, f"rows: {type(e).__name__}: {e}"]
    if every_cell_ok and (cells.empty or not (cells["status"] == "ok").all()):
        lost.append(f"finished cells: {cells[['strategy', 'status']].to_dict('records')}")
    return lost


def _no_run_started(tmp: Path) -> list[str]:
    return [f"a run folder was started: {d}" for d in _runs(tmp)]


def _hanging_module(tmp: Path) -> None:
    (tmp / "hangmod.py").write_text("import time\ntime.sleep(3600)\n")


def _sigkill(id_: str, when, strategies: str, *more: str) -> Case:
    return Case(id_, "run", ["-v", "run", "--out", "{tmp}/out", *TINY, "--world-sizes", "1", "--strategies", strategies,
                             "--cell-timeout", "300", *more], signal=(signal.SIGKILL, when), env=PATH_ENV,
                timeout_s=240)


def _during_report(sig: signal.Signals, code: int) -> Case:
    return Case(f"{sig.name.lower()}-during-report", "run",
                ["run", "--out", "{tmp}/out", *TINY, "--world-sizes", "1", "--strategies", "single", "--report"],
                signal=(sig, "every cell: parbench report"), group=sig == signal.SIGINT, code=code,
                expect=f"interrupted by {sig.name}: the run's cells (all of them finished) are in {{tmp}}/out/",
                kept=_rows_whole, env=PATH_ENV, timeout_s=240)


CASES = [
    # planning a user workload has a limit; the message names the factory and what it was doing
    Case("workload-factory-hangs", "run", ["run", "--out", "{tmp}/out", *TINY, "--workloads",
                                           "tests.helpers:factory_hangs", "--workload-timeout", "3"],
         expect="workload 'tests.helpers:factory_hangs': its factory factory_hangs() did not return within 3 s",
         kept=_no_run_started),
    Case("workload-timeout-0", "run", ["run", "--out", "{tmp}/out", "--device", "cpu", "--workload-timeout", "0"],
         expect="--workload-timeout 0: use seconds > 0"),
    Case("startup-timeout-negative", "run", ["run", "--out", "{tmp}/out", "--device", "cpu", "--startup-timeout=-5"],
         expect="--startup-timeout -5: use seconds > 0"),
    # a module whose import never returns: the command still exits (the planning thread is a daemon)
    Case("workload-import-hangs", "run", ["run", "--out", "{tmp}/out", *TINY, "--workloads", "hangmod:make",
                                          "--workload-timeout", "3"],
         setup=_hanging_module, expect="workload 'hangmod:make': the import of 'hangmod' did not return within 3 s",
         kept=_no_run_started, subprocess=True, env=PATH_ENV, timeout_s=120),
    # a user factory that leaves a non-daemon thread: the command still ends after its answer, saying so
    Case("workload-leaves-a-thread", "run", ["run", "--out", "{tmp}/out", *[a for a in TINY if a != "mlp"][:4],
                                             *TINY[6:], "--strategies", "single", "--world-sizes", "1",
                                             "--workloads", "tests.helpers:factory_thread"],
         code=0, expect="parbench: ending with thread(s) still running that parbench did not start (user-loader); "
                        "they were stopped with the process",
         kept=_rows_whole, subprocess=True, env=PATH_ENV, timeout_s=180),
    # a user factory that forks a child ignoring SIGTERM while the run is planned: killed and named
    Case("workload-forks-a-child", "run", ["run", "--out", "{tmp}/out", *[a for a in TINY if a != "mlp"][:4],
                                           *TINY[6:], "--strategies", "single", "--world-sizes", "1",
                                           "--workloads", "tests.helpers:factory_forks"],
         code=0, expect="its factory left 1 process(es) running", kept=_rows_whole, subprocess=True, env=PATH_ENV,
         timeout_s=180),
    # the launcher SIGKILLed at each moment of a run: nothing it started outlives it by 5 s
    _sigkill("sigkill-right-after-start", 1.0, "single"),
    _sigkill("sigkill-once-torchrun-is-up", "torchrun started", "single"),
    _sigkill("sigkill-mid-cell", "(test-hangs mlp) started", "tests.helpers:Hangs"),
    _sigkill("sigkill-in-the-profile-pass", "profile pass of cell 1", "tests.helpers:HangsWhenProfiled",
             "--profile-steps", "1", "--profile-at", "end"),
    _sigkill("sigkill-in-teardown", "(single mlp) ok", "single"),  # the group's last row: torchrun is ending
    # a stop signal after the cells, while the report is written: the rows are whole, one line
    _during_report(signal.SIGTERM, 143),
    _during_report(signal.SIGINT, 130),
]


@pytest.mark.parametrize("case", params(CASES))
def test_run(case, tmp_path):
    check(case, tmp_path)


# --- A full disk


def _enospc(path) -> OSError:
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))


def _two_rows_then(writer_fault):
    """A stand-in for the groups (no torchrun): every planned cell gets a row of its own part, then
    ``writer_fault(writer)`` runs."""
    from bench.results.rows import failure_row

    def run_groups(todo, ctx, *a, **kw):
        for p in todo.cells:
            ctx.writer.append("cells", [failure_row(p.spec, status="skipped", reason="stand-in")])
        writer_fault(ctx.writer)

    return run_groups


def _full_at_compaction(monkeypatch) -> None:
    import pyarrow.parquet as pq

    real = pq.write_table

    def write_table(table, where, *a, **kw):
        if ".compact" in str(where):
            Path(where).write_bytes(b"PAR1")  # half a part, as a full disk leaves it
            raise _enospc(where)
        return real(table, where, *a, **kw)

    monkeypatch.setattr("bench.train.launcher._run_groups", _two_rows_then(lambda _w: None))
    monkeypatch.setattr("bench.results.store.pq.write_table", write_table)


def _full_mid_run(monkeypatch) -> None:
    """The disk fills after the first rows: every later write fails (the final meta.json too)."""
    def no_room(_table, where, *a, **kw):
        raise _enospc(where)

    def no_text(path, *a, **kw):
        raise _enospc(path)

    def fill(writer):
        monkeypatch.setattr("bench.results.store.pq.write_table", no_room)
        monkeypatch.setattr(Path, "write_text", no_text)
        writer.append("steps", [{"cell_id": 9, "step": 0}])

    monkeypatch.setattr("bench.train.launcher._run_groups", _two_rows_then(fill))


INJECTED = [
    (Case("disk-full-at-compaction", "run", ["run", "--out", "{tmp}/out", *TINY, "--strategies", "single,ddp"],
          expect="(No space left on device): it needs about",
          kept=lambda tmp: _rows_whole(tmp, every_cell_ok=False)), _full_at_compaction),
    (Case("disk-full-mid-run", "run", ["run", "--out", "{tmp}/out", *TINY, "--strategies", "single,ddp"],
          expect="(No space left on device); the finished cells are kept: free space and run parbench run --resume",
          kept=lambda tmp: _rows_whole(tmp, every_cell_ok=False)), _full_mid_run),
]


@pytest.mark.parametrize("case, fault", [pytest.param(c, f, id=c.id) for c, f in INJECTED])
def test_run_out_of_space(case, fault, tmp_path, monkeypatch):
    """ENOSPC injected (in this process) at a write of the run path: one line, exit 2, every row
    written before it reads back, no scratch copy left."""
    fault(monkeypatch)
    check(case, tmp_path)


@pytest.fixture
def small_disk(tmp_path):
    """A 2 MiB tmpfs at {tmp}/disk (skipped where mounting is not allowed), unmounted afterwards."""
    with mounted_tmpfs(tmp_path / "disk", "2m") as disk:
        yield disk


def _fill_disk(tmp: Path) -> None:
    """Leave about 250 KiB free: a run at 1000 Hz of telemetry fills that, at the latest when it
    merges its parts (which takes their size again)."""
    (tmp / "disk" / "filler").write_bytes(os.urandom(2 * 1024 * 1024 - 250 * 1024))


DISK_FULL = Case("disk-full-tmpfs", "run", ["run", "--out", "{tmp}/disk", *TINY[:-3], "--no-progress", "--sample-hz",
                                            "1000", "--strategies", "single,ddp", "--world-sizes", "2"],
                 setup=_fill_disk, expect="(No space left on device)",
                 kept=lambda tmp: _rows_whole(tmp, "disk", every_cell_ok=False), subprocess=True, env=PATH_ENV,
                 timeout_s=300)


@pytest.mark.parametrize("case", params([DISK_FULL]))
def test_run_on_a_full_disk(case, tmp_path, small_disk):
    check(case, tmp_path)


# --- A machine loaded far past its cores


@pytest.fixture
def busy_cores():
    """Eight busy loops beside the run, stopped by their pids afterwards."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(8)]
    try:
        yield procs
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


def _every_cell_contended_none_timed_out(tmp: Path) -> list[str]:
    from bench.results.run import load_run

    lost = _rows_whole(tmp)
    if lost:
        return lost
    cells, _, _ = load_run(_runs(tmp)[0])
    bad = cells[(cells["status"] != "ok") | cells["contended"].fillna("").eq("")]
    return [f"cell {r.strategy}: status {r.status}, contended {r.contended!r}, reason {r.reason!r}"
            for r in bad.itertuples()]


LOADED = Case("loaded-machine", "run", ["run", "--out", "{tmp}/out", *TINY[:-3], "--no-progress", "--steps", "3",
                                        "--sample-hz", "5", "--strategies", "single,ddp", "--world-sizes", "2",
                                        "--cell-timeout", "8"],
              code=0, kept=_every_cell_contended_none_timed_out, subprocess=True, env=PATH_ENV, timeout_s=400)


@pytest.mark.parametrize("case", params([LOADED]))
def test_run_on_a_loaded_machine(case, tmp_path, busy_cores):
    """The run completes, every cell says it was contended, and no slow start-up (imports at an
    eighth of a core) is taken for a hung cell."""
    check(case, tmp_path)
