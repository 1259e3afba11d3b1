"""The collective sweep: one launch of :mod:`bench.comm.worker` per (backend, world size), its rows
collected into the run folder.

Each group is a plan file under ``<run>/work/`` started through :class:`bench.runtime.process.Launch`
(the runtime's command, environment and process tree: a timeout, a stop signal or an exception
kills the group's ranks); rank 0 writes the rows to ``<tag>-rows.json``. The tables are rewritten
after every group, so a stopped sweep keeps the groups that finished.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from bench.comm.model import fit
from bench.comm.worker import OPS, size_ladder
from bench.core.errors import UserError
from bench.core.spec import CollectiveGroupSpec, dump
from bench.measure.topology import topology
from bench.results.folder import check_out
from bench.results.identity import start_row
from bench.results.session import RunSession
from bench.results.store import new_run_id
from bench.runtime import signals
from bench.runtime.process import Launch, become_subreaper, child_env

WORKER = "bench.comm.worker"


@dataclass(kw_only=True)
class CommConfig:
    """Everything one sweep needs; ``to_dict`` goes into meta.json."""

    backends: list[str] = field(default_factory=lambda: ["nccl"])
    world_sizes: list[int] = field(default_factory=lambda: [2])
    device: str = "cuda"
    ops: list[str] = field(default_factory=lambda: list(OPS))
    dtypes: list[str] = field(default_factory=lambda: ["fp32", "bf16"])
    min_bytes: int = 2**10
    max_bytes: int = 2**30
    factor: int = 2
    iters: int = 20
    warmup: int = 5
    budget_s: float = 0.2
    max_iters: int = 1000
    graph_max_bytes: int = 0
    reference: bool = True
    group_timeout_s: float = 600.0
    out: str = "results"

    def sizes(self) -> list[int]:
        return size_ladder(self.min_bytes, self.max_bytes, self.factor)

    def groups(self, work: Path) -> list[CollectiveGroupSpec]:
        """The sweep's groups, one per (backend, world size) in that order; rank 0 of each writes its
        rows under ``work``."""
        return [CollectiveGroupSpec(
            backend=backend, device=self.device, world_size=world, ops=tuple(self.ops), dtypes=tuple(self.dtypes),
            sizes=tuple(self.sizes()), iters=self.iters, warmup=self.warmup, budget_s=self.budget_s,
            max_iters=self.max_iters, graph_max_bytes=self.graph_max_bytes, reference=self.reference,
            pg_timeout_s=self.group_timeout_s, out=str(work / f"{backend}-x{world}-rows.json"))
            for backend in self.backends for world in self.world_sizes]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


RowsFn = Callable[[list[dict[str, Any]]], None]


def run_group(group: CollectiveGroupSpec, timeout_s: float, on_rows: RowsFn | None = None) -> list[dict[str, Any]]:
    """One launch of ``group``; the rows rank 0 wrote, and one failure row when the launch did not
    end cleanly. ``on_rows(rows)`` is called each time rank 0 has rewritten its rows (after every op)."""
    out = Path(group.out)
    prefix = str(out.parent / f"{group.backend}-x{group.world_size}")
    Path(prefix + ".json").write_text(dump(group))
    launch = Launch(prefix, group.world_size, module=WORKER, env=child_env(group.world_size))
    rc = follow(launch, timeout_s, _RowsWatch(out, on_rows) if on_rows else None)
    rows = json.loads(out.read_text()) if out.is_file() else []
    if rc != 0:  # a stopped launch's own exit says nothing: the timeout is the reason
        why = f"still running after {timeout_s:g} s" if rc == "timeout" else launch.crash_reason(group.world_size)
        rows.append(start_row(group, status="failed", reason=f"group exited {rc}: {why}", kind="sweep"))
    return rows


class _RowsWatch:
    """Calls ``on_rows`` with the group's rows each time rank 0 has replaced its rows file."""

    def __init__(self, path: Path, on_rows: RowsFn):
        self.path, self.on_rows, self.seen = path, on_rows, 0.0

    def poll(self) -> None:
        try:
            mtime = self.path.stat().st_mtime
            if mtime != self.seen:
                self.seen = mtime
                self.on_rows(json.loads(self.path.read_text()))
        except (OSError, ValueError):  # not written yet; a whole file comes at the next poll
            return


def follow(launch: Launch, timeout_s: float, watch: _RowsWatch | None = None) -> int | str:
    """Wait for the launch to end: its return code, or "timeout" when it ran past ``timeout_s`` and
    was stopped. A stop signal (deferred by :func:`run_sweep`) is raised here between polls (the
    rows on disk are kept), and anything raised stops the launch's whole tree first."""
    deadline = time.monotonic() + timeout_s
    try:
        while not launch.exited():
            signals.check_stop()
            if watch is not None:
                watch.poll()
            if time.monotonic() > deadline:
                launch.kill()
                return "timeout"
            time.sleep(0.05)
    except BaseException:
        launch.kill()
        raise
    launch.survivors()
    return launch.returncode


def write_atomic(df: pd.DataFrame, path: Path) -> None:
    """Through a temporary file and a rename: a killed sweep leaves the last complete table, and a
    full disk or a folder gone read-only is one line that says the earlier table is whole."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        df.to_parquet(tmp, index=False)
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        kept = "the groups written before are kept in it" if path.exists() else "no group was written yet"
        raise UserError(f"cannot write {path} ({e.strerror or e}); {kept}: free space or pass a writable "
                        "--out") from None


def add_reference(df: pd.DataFrame) -> pd.DataFrame:
    """``reference_busbw_gbs`` on every row: the plain loop's busbw of the same backend, device,
    world size and dtype, and ``vs_reference`` = busbw / reference on the all_reduce rows."""
    df = df.copy()
    keys = ["backend", "device", "world_size", "dtype"]
    for col in (*keys, "kind", "op", "busbw_gbs"):  # a group that failed before its first result has
        if col not in df:                          # one row without them
            df[col] = float("nan") if col == "busbw_gbs" else None
    ref = df[df["kind"] == "reference"].groupby(keys)["busbw_gbs"].max().rename("reference_busbw_gbs")
    df = df.join(ref, on=keys) if len(ref) else df.assign(reference_busbw_gbs=float("nan"))
    ar = (df["kind"] == "sweep") & (df["op"] == "all_reduce")
    df["vs_reference"] = (df["busbw_gbs"] / df["reference_busbw_gbs"]).where(ar)
    return df


GroupFn = Callable[[CollectiveGroupSpec, list[dict[str, Any]] | None, bool], None]


def run_sweep(cfg: CommConfig, on_group: GroupFn | None = None) -> Path:
    """The whole sweep; returns the run folder (tables rewritten after every group). ``on_group(group,
    rows, done)`` reports progress: rows None as a group starts, its rows so far after each op, and
    done once its rows are in the table. A stop signal is raised only while a group runs or between
    groups; meta.json says how the sweep ended (:class:`bench.results.session.RunSession`)."""

    check_out(cfg.out)  # an unwritable --out is a one-line error, before any group starts
    become_subreaper()  # a rank whose torchrun agent dies is re-parented here, where its tree is killed
    run_dir = Path(cfg.out) / new_run_id()
    work = run_dir / "work"
    work.mkdir(parents=True)
    topo = topology()
    note = on_group or (lambda _g, _rows, _done: None)
    rows: list[dict[str, Any]] = []
    # a stop signal is only noted, and raised where nothing is half written: before a group starts
    # and while one runs (follow), never between a group's end and its rows in the table
    with RunSession(run_dir, cfg.to_dict(), fields=lambda _status: {"command": "comm", "topology": topo},
                    defer=True) as session:
        session.begin()
        for group in cfg.groups(work):
            signals.check_stop()
            note(group, None, False)
            got = run_group(group, cfg.group_timeout_s, lambda r, g=group: note(g, r, False))
            rows.extend({"run_id": run_dir.name, **r} for r in got)
            df = add_reference(pd.DataFrame(rows))
            write_atomic(df, run_dir / "collectives.parquet")
            note(group, got, True)
        ok = df[(df["status"] == "ok") & (df["kind"] == "sweep")] if "status" in df else df.iloc[:0]
        if len(ok):
            write_atomic(fit(ok).fits, run_dir / "comm_model.parquet")
        signals.check_stop()  # a stop noted while the last group was written
    return run_dir


def summary_table(df: pd.DataFrame, sizes: tuple[int, ...] = (2**10, 2**20, 2**24, 2**28, 2**30)) -> str:
    """busbw (GB/s) by op at a few sizes, per backend/device/world/dtype; wrong counts; failures."""
    ok = df[(df.get("status") == "ok") & (df.get("kind") == "sweep")]
    lines = []
    if len(ok):
        pick = ok[ok["bytes"].isin(set(sizes) | {ok["bytes"].max()})]
        t = pick.pivot_table(index=["backend", "device", "world_size", "dtype", "op"], columns="bytes",
                             values="busbw_gbs", aggfunc="max")
        t.columns = [_human(int(c)) for c in t.columns]
        lines.append("busbw GB/s (nccl-tests definition):\n" + t.round(2).to_string())
        lat = ok[ok["bytes"] == ok["bytes"].min()].groupby(["backend", "world_size", "op"])["time_s"].min() * 1e6
        lines.append(f"latency at {_human(int(ok['bytes'].min()))} (us):\n" + lat.round(1).unstack("op").to_string())
        lines.append(f"wrong elements: {int(ok['wrong'].fillna(0).sum())} over {len(ok)} points")
    ref = df[df.get("kind") == "reference"]
    for _, r in ref.iterrows():
        top = ok[(ok["op"] == "all_reduce") & (ok["backend"] == r["backend"]) & (ok["world_size"] == r["world_size"])
                 & (ok["dtype"] == r["dtype"]) & (ok["bytes"] == r["bytes"])]
        mine = float(top["busbw_gbs"].max()) if len(top) else float("nan")
        lines.append(f"plain loop all_reduce {r['backend']} x{r['world_size']} {r['dtype']} {_human(int(r['bytes']))}: "
                     f"{r['busbw_gbs']:.1f} GB/s; sweep {mine:.1f} GB/s = {mine / r['busbw_gbs']:.3f} of it")
    bad = df[df.get("status") != "ok"] if "status" in df else df.iloc[:0]
    if len(bad):
        lines.append("not measured:\n" + bad.drop_duplicates(["backend", "world_size", "op", "status"])[
            ["backend", "world_size", "op", "status", "reason"]].to_string(index=False))
    return "\n".join(lines)


def _human(n: int) -> str:
    for unit, k in (("G", 2**30), ("M", 2**20), ("K", 2**10)):
        if n >= k and n % k == 0:
            return f"{n // k}{unit}"
    return str(n)


