"""`parbench comm` held to the fault standard: bad flags and values, an output folder that cannot be
written or fills up, stop signals at start-up, mid-sweep and while a finished group is written, and
a rank that is killed or raises in the middle of the sweep.

Bad input and the writes run in this process (the writes through groups that return their rows at
once, :func:`_instant_group`, so a signal or a full disk lands exactly inside a finished group's
write); signals and dying ranks go through a real command with real torchrun groups (``faults``).
"""

from __future__ import annotations

import errno
import json
import os
import signal
import threading
import time
from pathlib import Path

import pandas as pd
import psutil
import pytest

from bench.results.identity import start_row
from tests.faults.harness import Case, check, meta_status, params, plain_file, with_base

#: the smallest sweep: one op, one dtype, three sizes, two calls each, on two gloo ranks
BASE = {"--device": "cpu", "--ops": "all_reduce", "--dtypes": "fp32", "--min-bytes": "1K", "--max-bytes": "4K",
        "--iters": "2", "--warmup": "0", "--budget": "0", "--out": "{tmp}/out"}


def comm(*flags: str) -> list[str]:
    """``parbench comm`` with BASE, the flags given replacing BASE's."""
    return [*with_base("comm", BASE, flags), "--no-reference"]


BAD = [
    Case("iters-zero", "comm", comm("--iters", "0"), expect="--iters 0: use a number of calls from 1"),
    Case("iters-huge", "comm", comm("--iters", "10000000"), expect="--iters 10000000: use a number of calls"),
    Case("iters-word", "comm", comm("--iters", "ten"), expect="'ten'"),
    Case("warmup-negative", "comm", comm("--warmup", "-1"), expect="--warmup -1: use a number of calls from 0"),
    Case("factor-zero", "comm", comm("--factor", "0"), expect="--factor 0: use 2 or 4"),
    Case("timeout-nan", "comm", comm("--timeout", "nan"), expect="--timeout nan: use a positive number"),
    Case("timeout-huge", "comm", comm("--timeout", "1e12"), expect="--timeout 1e+12: use a positive number"),
    Case("min-bytes-zero", "comm", comm("--min-bytes", "0"), expect="--min-bytes 0 / --max-bytes 4096"),
    Case("max-bytes-word", "comm", comm("--max-bytes", "lots"), expect="--max-bytes 'lots' is not a size"),
    Case("graph-max-bytes-word", "comm", comm("--graph-max-bytes", "x"), expect="--graph-max-bytes 'x' is not a size"),
    Case("backends-empty", "comm", comm("--backends", ""), expect="--backends is empty"),
    Case("world-sizes-empty", "comm", comm("--world-sizes", ""), expect="--world-sizes '': collectives need"),
    Case("world-sizes-word", "comm", comm("--world-sizes", "two"), expect="--world-sizes 'two'"),
    Case("dtypes-unknown", "comm", comm("--dtypes", "fp64"), expect="--dtypes has 'fp64'"),
    Case("device-unknown", "comm", comm("--device", "tpu"), expect="'tpu'"),
    Case("config-not-taken", "comm", comm("--config", "{tmp}/comm.toml"), expect="unrecognized arguments: --config"),
    Case("out-under-file", "comm", comm("--out", "{tmp}/f/sub"), setup=plain_file("f"),
         expect="'{tmp}/f/sub' is not writable (a part of the path is a file)"),
    Case("out-empty", "comm", comm("--out", ""), expect="--out '' is empty"),
]


@pytest.mark.parametrize("case", params(BAD))
def test_bad_input(case, tmp_path):
    check(case, tmp_path)


# --- the sweep's own writes, through groups that return their rows at once ----------------------

def _instant_group(group, timeout_s, on_rows=None):
    """run_group without processes: one measured point per size."""
    return [start_row(group.point("sweep", "all_reduce", "fp32", n), count=n // 4, iters=2, warmup=0, graph=False,
                      time_s=1e-4, time_max_s=1e-4, algbw_gbs=n / 1e-4 / 1e9, busbw_gbs=n / 1e-4 / 1e9, wrong=0)
            for n in group.sizes]


def _on_table_write(monkeypatch, act) -> None:
    """Groups through :func:`_instant_group`; ``act(write, n)`` does the n-th write of collectives.parquet."""
    monkeypatch.setattr("bench.comm.sweep.run_group", _instant_group)
    write, calls = pd.DataFrame.to_parquet, []

    def patched(df, path, *a, **kw):
        if ".collectives.parquet" in str(path):
            calls.append(path)
            return act(lambda: write(df, path, *a, **kw), len(calls))
        return write(df, path, *a, **kw)

    monkeypatch.setattr(pd.DataFrame, "to_parquet", patched)


def _second_write_disk_full(write, n):
    if n == 2:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    write()


def _sigterm_inside_first(write, n):
    write()  # the table is on disk under its temporary name, its rename not yet done
    if n == 1:
        os.kill(os.getpid(), signal.SIGTERM)


def _run_dir(tmp: Path) -> Path | None:
    dirs = sorted(p for p in (tmp / "out").glob("*") if p.is_dir())
    return dirs[0] if dirs else None


def _groups(*worlds: int, status: str | None = None, failed: int = 0):
    """kept(tmp): collectives.parquet has measured points of exactly the world sizes ``worlds``
    (and ``failed`` failure rows), and meta.json says ``status`` (its start)."""

    def kept(tmp: Path) -> list[str]:
        d = _run_dir(tmp)
        if d is None:
            return ["no run folder"]
        lost = []
        try:
            df = pd.read_parquet(d / "collectives.parquet") if worlds or failed else pd.DataFrame()
        except OSError as e:
            return [f"collectives.parquet: {e}"]
        ok = df[df["status"] == "ok"] if len(df) else df
        if set(ok["world_size"] if len(ok) else []) != set(worlds):
            lost.append(f"measured world sizes {sorted(set(ok['world_size']) if len(ok) else [])}, expected {worlds}")
        if failed and int((df["status"] == "failed").sum()) != failed:
            lost.append(f"{int((df['status'] == 'failed').sum())} failure rows, expected {failed}")
        return [*lost, *meta_status(d, status)]

    return kept


def _rank0_rows(least: int):
    """kept(tmp): rank 0's rows file of the group that was running holds ``least`` measured points,
    whole (a group's rows reach the table when it ends; until then this file is what it measured)."""

    def kept(tmp: Path) -> list[str]:
        files = list(tmp.glob("out/*/work/*-rows.json"))
        try:
            rows = [r for f in files for r in json.loads(f.read_text()) if r.get("status") == "ok"]
        except (OSError, ValueError) as e:
            return [f"rows file: {e}"]
        return [] if len(rows) >= least else [f"{len(rows)} measured points in {files}, {least} expected"]

    return kept


TWO_GROUPS = comm("--world-sizes", "2,3")
PATCHED = [
    (Case("disk-full-second-group", "comm", TWO_GROUPS, expect="(No space left on device); the groups written "
          "before are kept in it", kept=_groups(2, status="stopped: cannot write")), _second_write_disk_full),
    (Case("sigterm-while-a-group-is-written", "comm", TWO_GROUPS, code=143,
          expect="interrupted by SIGTERM: the groups that finished are in {tmp}/out/",
          kept=_groups(2, status="interrupted by SIGTERM")), _sigterm_inside_first),
]


@pytest.mark.parametrize("case,act", [pytest.param(c, a, id=c.id) for c, a in PATCHED])
def test_the_sweeps_writes(case, act, tmp_path, monkeypatch):
    _on_table_write(monkeypatch, act)
    check(case, tmp_path)


# --- real processes: stop signals and ranks that die --------------------------------------------

def _rank_signal(signum: int):
    """setup(tmp): a thread that sends ``signum`` to rank 1 of the sweep under ``tmp`` once rank 0
    has written the first op's rows (the sweep is then mid-way: three ops are left)."""

    def setup(tmp: Path) -> None:
        def watch() -> None:
            end = time.monotonic() + 120
            while time.monotonic() < end:
                if any(json.loads(p.read_text() or "[]") for p in tmp.glob("out/*/work/*-rows.json")):
                    for p in psutil.process_iter(["cmdline"]):
                        try:
                            if any(str(tmp) in a for a in p.info["cmdline"] or []) and \
                                    "bench.comm.worker" in p.info["cmdline"] and p.environ().get("RANK") == "1":
                                p.send_signal(signum)
                                return
                        except (psutil.Error, TypeError):
                            continue
                time.sleep(0.05)

        threading.Thread(target=watch, daemon=True).start()

    return setup


FOUR_OPS = comm("--ops", "all_reduce,broadcast,all_gather,reduce_scatter", "--budget", "0.3")
REAL = [
    Case("sigint-at-start-up", "comm", comm(), code=130, signal=(signal.SIGINT, "measuring"), group=True,
         expect="interrupted by SIGINT: the groups that finished are in {tmp}/out/",
         kept=_groups(status="interrupted by SIGINT"), timeout_s=90),
    Case("sigterm-mid-sweep", "comm", TWO_GROUPS, code=143, signal=(signal.SIGTERM, "x2: 3 points measured"),
         expect="interrupted by SIGTERM: the groups that finished are in {tmp}/out/",
         kept=_groups(2, status="interrupted by SIGTERM"), timeout_s=120),
    Case("sigkill-mid-sweep", "comm", FOUR_OPS, signal=(signal.SIGKILL, "x2: all_reduce done"),
         kept=_rank0_rows(3), timeout_s=120),
    Case("rank-killed", "comm", FOUR_OPS, code=1, subprocess=True, setup=_rank_signal(signal.SIGKILL),
         expect="gloo x2 failed: group exited 1: rank 1 exited with signal 9 (SIGKILL)",
         kept=_groups(2, status="complete", failed=1), timeout_s=120),
    # The rank raises KeyboardInterrupt and exits by SIGINT, unless its teardown is still running when
    # torchrun, seeing rank 0 fail without its peer, ends it with SIGTERM, or gloo's teardown aborts
    # it (SIGABRT): both seen on a loaded machine; the message names the rank and its exception either way.
    Case("rank-raises", "comm", FOUR_OPS, code=1, subprocess=True, setup=_rank_signal(signal.SIGINT),
         expect=tuple(f"gloo x2 failed: group exited 1: rank 1 exited with signal {s}: KeyboardInterrupt;"
                      for s in ("2 (SIGINT)", "15 (SIGTERM)", "6 (SIGABRT)")),
         kept=_groups(2, status="complete", failed=1), timeout_s=120),
]


@pytest.mark.parametrize("case", params(REAL))
def test_in_a_real_process(case, tmp_path):
    check(case, tmp_path)
