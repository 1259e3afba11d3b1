"""`parbench serve` held to the fault standard: bad flags and values, an output folder that cannot be
written or fills up, stop signals at start-up, mid-run and while a finished cell is written, and user
models that raise, crash, hang or never load.

Bad input and the writes run in this process (the writes through a pool that answers at once,
:class:`_InstantPool`, so a signal or a full disk lands exactly inside a finished cell's write);
signals and broken models go through a real command with real serving processes (``faults``).
"""

from __future__ import annotations

import errno
import os
import signal
import time
from pathlib import Path

import pytest

import tests.helpers  # noqa: F401 - imported once here, so a user workload's import costs nothing in-process
from bench.results.store import read_table
from tests.faults.harness import Case, check, meta_status, params, plain_file, with_base

ROOT = str(Path(__file__).resolve().parents[2])
#: the smallest serving run: one process, five requests, one cell per policy
BASE = {"--device": "cpu", "--world-sizes": "1", "--requests": "5", "--rates": "50", "--sample-hz": "0",
        "--policies": "round-robin", "--out": "{tmp}/out"}


def serve(*flags: str, parity: bool = False) -> list[str]:
    """``parbench serve`` with BASE, the flags given replacing BASE's."""
    return [*with_base("serve", BASE, flags), *([] if parity else ["--no-parity"])]


BAD = [
    Case("world-sizes-zero", "serve", serve("--world-sizes", "0"), expect="--world-sizes 0 must be"),
    Case("world-sizes-too-many", "serve", serve("--world-sizes", "1000"), expect="--world-sizes 1000: more serving"),
    Case("world-sizes-word", "serve", serve("--world-sizes", "two"), expect="'two'"),
    Case("duration-word", "serve", serve("--duration", "abc"), expect="'abc'"),
    Case("duration-inf", "serve", serve("--duration", "inf"), expect="--duration inf must be"),
    Case("rates-tiny", "serve", serve("--rates", "1e-300"), expect="--requests 5 at --rates 1e-300"),
    Case("batch-max-zero", "serve", serve("--batch-max", "0"), expect="--batch-max 0 must be"),
    Case("batch-wait-nan", "serve", serve("--batch-wait-ms", "nan"), expect="--batch-wait-ms nan must be"),
    Case("clients-zero", "serve", serve("--clients", "0"), expect="--clients 0 must be"),
    Case("seed-negative", "serve", serve("--seed=-1"), expect="--seed -1 must be"),
    Case("seed-huge", "serve", serve("--seed", "99999999999999999999999"), expect="--seed 99999999999999999999999"),
    Case("cell-timeout-huge", "serve", serve("--cell-timeout", "1e300"), expect="--cell-timeout 1e+300 must be"),
    Case("requests-huge", "serve", serve("--requests", "2000000"), expect="--requests 2000000 must be"),
    Case("cv-inf", "serve", serve("--arrival", "gamma", "--cv", "inf"), expect="--cv inf must be"),
    Case("noisy-rates-zero", "serve", serve("--noisy", "--noisy-rates", "0,5"), expect="--noisy-rates 0: rates"),
    Case("noisy-rates-alone", "serve", serve("--noisy-rates", "5,50"), expect="add --noisy"),
    Case("slow-inf", "serve", serve("--slow", "0=inf"), expect="--slow 0=inf"),
    Case("slow-no-such-process", "serve", serve("--slow", "7=5"), expect="--slow 7=5: PROCESS must be 0..0"),
    Case("tenant-alpha-zero", "serve", serve("--tenants", "a:size=pareto,alpha=0"), expect="alpha 0.0 must be"),
    Case("precision-unknown", "serve", serve("--precision", "fp16"), expect="'fp16'"),
    Case("config-not-taken", "serve", serve("--config", "{tmp}/serve.toml"), expect="unrecognized arguments: --config"),
    Case("out-under-file", "serve", serve("--out", "{tmp}/f/sub"), setup=plain_file("f"),
         expect="'{tmp}/f/sub' is not writable (a part of the path is a file)"),
    Case("out-empty", "serve", serve("--out", ""), expect="--out '' is empty"),
    Case("factory-raises", "serve", serve("--workload", "tests.helpers:factory_raises"),
         expect="its factory raised RuntimeError: deliberate failure in the factory"),
    Case("factory-hangs", "serve", serve("--workload", "tests.helpers:factory_hangs", "--workload-timeout", "1"),
         expect="its factory factory_hangs() did not return within 1 s"),
    Case("workload-timeout-zero", "serve", serve("--workload-timeout", "0"), expect="--workload-timeout 0 must be"),
]


@pytest.mark.parametrize("case", params(BAD))
def test_bad_input(case, tmp_path):
    check(case, tmp_path)


# --- the run's own writes, through a pool that answers at once ----------------------------------

class _InstantPool:
    """A placement's pool in this process that answers every request 10 ms after it arrives."""

    def __init__(self, placement: str, world: int, devices: list[str], base: dict, **_kw):
        from bench.serve.launcher import specs

        self.placement, self.world = placement, world
        self.specs = specs(placement, world, devices, base)
        self.entries = len(self.specs)

    def probe(self, items, timeout=0.0, warm=False, batch=1):
        return {}

    def run_cell(self, *, requests, **_kw):
        from bench.serve.launcher import CellResult

        recs = [{"rid": r.rid, "tenant": r.tenant, "size": r.size, "arrival": r.arrival, "dispatch": r.arrival,
                 "worker": r.rid % self.entries, "start": r.arrival, "end": r.arrival + 0.01, "batch": 1}
                for r in requests]
        stats = {"busy_s": 0.01, "batches": len(recs), "served": len(recs), "peak_mem_bytes": None, "energy_j": None}
        return CellResult(records=recs, workers={s.wid: stats for s in self.specs}, t0=0.0, t0_unix=time.time(),
                          wall_s=0.1)

    def close(self, grace_s: float = 5.0) -> None:
        pass


def _on_cells_write(monkeypatch, act) -> None:
    """Serving through :class:`_InstantPool`; ``act(write, data, path)`` writes the cells table's parts."""
    import pyarrow.parquet as pq

    monkeypatch.setattr("bench.serve.run.Pool", _InstantPool)
    write = pq.write_table

    def patched(data, path, *a, **kw):
        if "cells.parquet" in str(path):
            return act(lambda: write(data, path, *a, **kw))
        return write(data, path, *a, **kw)

    monkeypatch.setattr(pq, "write_table", patched)


def _disk_full(write):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def _sigterm_inside(write):
    write()  # the part is on disk, its rename not yet done: a stop here must not lose the row
    os.kill(os.getpid(), signal.SIGTERM)


def _run_dir(tmp: Path) -> Path | None:
    dirs = sorted(p for p in (tmp / "out").glob("*") if p.is_dir())
    return dirs[0] if dirs else None


def _rows(least: int, most: int | None = None, status: str | None = None, printed: str | None = None):
    """kept(tmp): the run folder's cells table has ``least`` (to ``most``) ok rows, at least as many
    as the command printed as finished (``printed``: the case whose stdout to read), and meta.json
    says ``status`` (its start)."""

    def kept(tmp: Path) -> list[str]:
        d = _run_dir(tmp)
        if d is None:
            return ["no run folder"]
        cells = read_table(d, "cells")
        ok = int((cells["status"] == "ok").sum()) if len(cells) else 0
        # a finished cell's line: "... 12.3 req/s  p50 ..." (its "limited by" line may name a rate too)
        shown = (tmp / f".{printed}.stdout").read_text().count(" req/s  p50 ") if printed else 0
        lost = [f"{ok} ok cell rows, {least}..{most} expected"] if not least <= ok <= (most or ok) else []
        lost += [f"{shown} cells printed as finished, {ok} rows"] if shown > ok else []
        return [*lost, *meta_status(d, status)]

    return kept


TWO_CELLS = serve("--policies", "round-robin,jsq")
PATCHED = [
    (Case("disk-full", "serve", TWO_CELLS, expect="(No space left on device); the cells that finished are kept",
          kept=_rows(0, 0, "stopped: cannot write the cells table")), _disk_full),
    (Case("sigterm-while-a-cell-is-written", "serve", TWO_CELLS, code=143,
          expect="interrupted by SIGTERM: the cells that finished are in {tmp}/out/",
          kept=_rows(1, 1, "interrupted by SIGTERM")), _sigterm_inside),
]


@pytest.mark.parametrize("case,act", [pytest.param(c, a, id=c.id) for c, a in PATCHED])
def test_the_runs_writes(case, act, tmp_path, monkeypatch):
    _on_cells_write(monkeypatch, act)
    check(case, tmp_path)


# --- real processes: stop signals and broken models ---------------------------------------------

SLOW_CELLS = serve("--policies", "round-robin,jsq,random", "--rates", "4", "--requests", "8", "--cell-timeout", "60")
ENV = {"PYTHONPATH": ROOT}
REAL = [
    Case("sigint-at-start-up", "serve", serve(), code=130, signal=(signal.SIGINT, "starting 1 device"), group=True,
         expect="interrupted by SIGINT: the cells that finished are in {tmp}/out/",
         kept=_rows(0, 0, "interrupted by SIGINT"), timeout_s=90),
    Case("sigterm-mid-run", "serve", SLOW_CELLS, code=143, signal=(signal.SIGTERM, "req/s"),
         expect="interrupted by SIGTERM: the cells that finished are in {tmp}/out/",
         kept=_rows(1, 2, "interrupted by SIGTERM", printed="sigterm-mid-run"), timeout_s=90),
    Case("sigkill-mid-run", "serve", SLOW_CELLS, signal=(signal.SIGKILL, "req/s"),
         kept=_rows(1, 2, printed="sigkill-mid-run"), timeout_s=90),
    Case("forward-raises", "serve", serve("--workload", "tests.helpers:forward_raises"), code=1, env=ENV,
         subprocess=True, expect="failed during the warm-up: RuntimeError: forward exploded on purpose; rows in",
         timeout_s=90),
    Case("forward-crashes", "serve", serve("--workload", "tests.helpers:forward_crashes"), code=1, env=ENV,
         subprocess=True, expect="parbench-serve-0 exited with signal 11 (SIGSEGV) during the warm-up", timeout_s=90),
    Case("forward-hangs", "serve", serve("--workload", "tests.helpers:forward_hangs", "--cell-timeout", "3"), code=1,
         env=ENV, subprocess=True, expect="no answer within 3 s during the warm-up", timeout_s=90),
]


@pytest.mark.parametrize("case", params(REAL))
def test_in_a_real_process(case, tmp_path):
    check(case, tmp_path)
