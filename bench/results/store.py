"""The run folder: append-only tables that survive a killed run, metadata, derived columns.

``DIR/<run-id>/`` holds the tables ``cells``, ``steps``, ``comm`` and ``samples`` and ``meta.json``.
Each table is a folder of parquet parts (``cells.parquet/part-000001.parquet`` ...): a finished
cell appends one part to each table, written to a hidden temporary name and renamed into place,
so nothing already on disk is rewritten and a run killed at any moment leaves every finished cell
readable. ``pandas.read_parquet(RUN/"cells.parquet")`` reads a table whole; :func:`load_run` also
adds the derived columns (parity, scaling efficiency: :mod:`bench.results.derived`), which are
computed when a run is read.
Files written by older versions (one ``cells.parquet`` file) still load.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from bench import SCHEMA_VERSION, __version__
from bench.core.errors import UserError
from bench.core.metrics import CORE, Metric, stored
from bench.measure.fingerprint import fingerprint
from bench.measure.hardware import gpu_count, gpu_names
from bench.results.bounds import check_table, typed
from bench.results.lock import RunLock, argv_command

STEP_COLUMNS: dict[str, str] = {
    "run_id": "string", "cell_id": "Int64", "repeat": "Int64", "rank": "Int64", "step": "Int64", "phase": "string",
    "step_time_s": "float64", "t_unix": "float64", "loss": "float64", "loss_weight": "float64",
}
COMM_COLUMNS: dict[str, str] = {
    "run_id": "string", "cell_id": "Int64", "rank": "Int64", "backend": "string", "world_size": "Int64",
    "op": "string", "group_size": "Int64", "bytes": "float64", "start_s": "float64", "duration_s": "float64",
    "kernel": "string",
}
SAMPLE_COLUMNS: dict[str, str] = {
    "host": "string", "device": "string", "t": "float64", "metric": "string", "value": "float64",
    "node": "Int64",  # the node (--node-rank) that sampled it; 0 on one machine
}
#: cells.parquet columns of the core registry (strategies' declared columns follow)
CELL_COLUMNS: dict[str, str] = {m.name: m.dtype for m in CORE}
_ARROW = {"string": pa.string(), "Int64": pa.int64(), "float64": pa.float64(), "boolean": pa.bool_()}


def new_run_id() -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:4]


def arrow_schema(columns: dict[str, str]) -> pa.Schema:
    return pa.schema([(name, _ARROW[dtype]) for name, dtype in columns.items()])


def cell_columns(metrics: Iterable[Metric]) -> dict[str, str]:
    """name -> dtype of the stored cell columns for a run whose strategies declare ``metrics``."""
    return {m.name: m.dtype for m in stored(metrics)}


def frame(rows: list[dict[str, Any]] | pd.DataFrame, schema: dict[str, str], *,
          source: str | None = None) -> pd.DataFrame:
    """Rows (or a frame) with the schema's columns first, typed; other columns after. A value is
    converted where that is unambiguous ("1.0" in an integer column is 1); one that is not raises a
    UserError naming the column, the value and ``source`` (the file it came from)."""
    df = rows.copy() if isinstance(rows, pd.DataFrame) else pd.DataFrame(rows)
    for col, dtype in schema.items():
        if col not in df:
            df[col] = pd.Series([None] * len(df), index=df.index, dtype="object")
        if str(df[col].dtype) != dtype:
            df[col] = typed(df[col], dtype, col, source)
    extra = [c for c in df.columns if c not in schema]
    return df[list(schema) + extra]


def require_columns(df: pd.DataFrame, cols: list[str], what: str) -> None:
    """Fail with the missing column's name rather than a KeyError deep in an analysis."""
    missing = [c for c in cols if c not in df.columns]
    if missing:
        raise UserError(f"{what} lacks column(s) {', '.join(missing)}; was it written by parbench "
                        f"schema {SCHEMA_VERSION}?")


class RunWriter:
    """Appends rows to a run folder's tables, one immutable part per call; never rewrites."""

    def __init__(self, run_dir: Path, *, cell_schema: dict[str, str] | None = None, resume: bool = False,
                 tables: dict[str, dict[str, str]] | None = None):
        self.dir = Path(run_dir)
        try:
            self.dir.mkdir(parents=True, exist_ok=resume)
        except OSError as e:
            if isinstance(e, FileExistsError):
                raise
            raise UserError(f"cannot create the run folder {self.dir} ({os_reason(e)}); free space or pass "
                            "a writable --out") from None
        self.lock = RunLock(self.dir, argv_command())  # one writer per run folder, until close()
        self.run_id = self.dir.name
        # ``tables``: further tables of this run (e.g. serving's requests), name -> column dtypes
        self.schemas = {"cells": cell_schema or CELL_COLUMNS, "steps": STEP_COLUMNS, "comm": COMM_COLUMNS,
                        "samples": SAMPLE_COLUMNS, **(tables or {})}
        self._arrow = {k: arrow_schema(v) for k, v in self.schemas.items()}
        self._seq = itertools.count(1 + max((_part_seq(p) for p in self.dir.glob("*.parquet/part-*.parquet")),
                                            default=0))

    def append(self, table: str, rows: Sequence[dict[str, Any]]) -> None:
        """Write ``rows`` as one new part of ``table`` (nothing if empty). Columns outside the
        table's schema are refused: the schema comes from the metric registry."""
        if not rows:
            return
        schema = self._arrow[table]
        stamped = [{"run_id": self.run_id, **r} for r in rows] if "run_id" in schema.names else rows
        unknown = {k for r in stamped for k in r} - set(schema.names)
        if unknown:
            raise ValueError(f"table {table}: columns {sorted(unknown)} are not in its schema (metric registry)")
        data = pa.Table.from_pylist([_clean(r) for r in stamped], schema=schema)
        folder = self.dir / f"{table}.parquet"
        name = f"part-{next(self._seq):06d}.parquet"
        tmp = folder / f".{name}.tmp"
        created = not folder.exists()
        try:
            folder.mkdir(exist_ok=True)
            pq.write_table(data, tmp)
            os.replace(tmp, folder / name)
        except BaseException as e:
            # A full disk (ENOSPC), a quota or a folder gone read-only: the parts already written
            # stay whole, and a table folder made for this part goes again (an empty one would read
            # as a table without columns); the run stops with one line and resumes once there is room.
            _unlink_quietly(tmp)
            if created:
                with contextlib.suppress(OSError):
                    folder.rmdir()
            if isinstance(e, OSError):
                raise write_error(folder / name, e, self.dir) from None
            raise

    def close(self) -> None:
        """The run folder's lock released: another command may write it (a resume)."""
        self.lock.release()

    def compact(self) -> None:
        """Merge each table's parts into one (at the end of a run: reading 1,000 parts costs
        seconds, one part milliseconds). The merged table is written beside the parts and swapped
        in with renames, so a killed compaction leaves either the parts or the merged table. A
        table whose merged copy does not fit on the disk keeps its parts (they read the same) and
        the compaction stops with a UserError that says how much space it needs; no scratch copy
        is left behind."""
        for name in self.schemas:
            folder = self.dir / f"{name}.parquet"
            parts = sorted(folder.glob("part-*.parquet")) if folder.is_dir() else []
            if len(parts) < 2:
                continue
            need = sum(p.stat().st_size for p in parts)
            free = shutil.disk_usage(self.dir).free
            if free < need:
                raise self._no_room(folder, need, free, "No space left on device")
            table = read_table(self.dir, name)
            try:
                self._swap_in(folder, pa.Table.from_pandas(table, preserve_index=False))
            except OSError as e:
                raise self._no_room(folder, need, shutil.disk_usage(self.dir).free, os_reason(e)) from None

    def _swap_in(self, folder: Path, data: pa.Table) -> None:
        """Write ``data`` as the one part of ``folder``'s table: beside it first, then two renames.
        Whatever stops it (a full disk, a signal) leaves the parts in place and no scratch copy."""
        tmp = self.dir / f".{folder.name}.compact"
        old = self.dir / f".{folder.name}.old"
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)
        try:
            tmp.mkdir()
            pq.write_table(data, tmp / f"part-{next(self._seq):06d}.parquet")
            os.replace(folder, old)
            os.replace(tmp, folder)
        except BaseException:
            if old.is_dir() and not folder.exists():
                os.replace(old, folder)
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        shutil.rmtree(old, ignore_errors=True)

    def _no_room(self, folder: Path, need: int, free: int, why: str) -> UserError:
        return UserError(f"cannot merge the parts of {folder} ({why}): it needs about {need / 2**20:.1f} MiB "
                         f"free, {free / 2**20:.1f} MiB is; the run's rows are kept as parts and read the same: free "
                         f"space and run parbench run --resume {self.dir} to merge them")

    def add(self, row: dict[str, Any], steps: Sequence[dict[str, Any]] = (),
            comm: Sequence[dict[str, Any]] = ()) -> None:
        """One finished cell: its steps and comm rows first, the cell row last (a reader that sees
        the cell row sees its steps)."""
        self.append("steps", steps)
        self.append("comm", comm)
        self.append("cells", [row])


def write_error(path: Path, e: OSError, run_dir: Path) -> UserError:
    """The one line for a write into the run folder that failed (a full disk, a quota, a folder gone
    read-only): what could not be written and why; the finished cells are kept and the run resumes
    from them."""
    return UserError(f"cannot write {path} ({os_reason(e)}); the finished cells are kept: free space and run "
                     f"parbench run --resume {run_dir}")


def os_reason(e: OSError) -> str:
    """The system's words for ``e`` ("No space left on device"), also where pyarrow wraps them in
    its own message ("Error writing bytes to file. Detail: [errno 28] ...")."""
    code = e.errno
    if code is None:
        m = re.search(r"\[errno (\d+)\]", str(e), re.IGNORECASE)
        code = int(m[1]) if m else None
    return os.strerror(code) if code else (e.strerror or " ".join(str(e).split()))


def _unlink_quietly(p: Path) -> None:
    try:
        p.unlink(missing_ok=True)
    except OSError:
        pass


def _part_seq(p: Path) -> int:
    try:
        return int(p.stem.split("-")[1])
    except (IndexError, ValueError):
        return 0


def _clean(row: dict[str, Any]) -> dict[str, Any]:
    """Python scalars for pyarrow: numpy numbers unwrapped, pandas NA to None."""
    out = {}
    for k, v in row.items():
        if isinstance(v, np.generic):
            v = v.item()
        elif v is pd.NA:
            v = None
        out[k] = v
    return out


def read_table(run_dir: str | os.PathLike, name: str, schema: dict[str, str] | None = None) -> pd.DataFrame:
    """One table of a run folder (a folder of parts, or one file from older versions); an empty
    frame with ``schema``'s columns when absent. Raises UserError naming a part that cannot be read."""
    path = Path(run_dir) / f"{name}.parquet"
    if not path.exists():
        # A compaction killed between its two renames leaves the parts under this name.
        old = Path(run_dir) / f".{name}.parquet.old"
        if old.is_dir():
            os.replace(old, path)
    if not path.exists():
        return frame([], schema or {})
    files = sorted(path.glob("part-*.parquet")) if path.is_dir() else [path]
    if not files:
        return frame([], schema or {})
    odd = [f for f in files if not f.is_file()]  # a FIFO would block its reader for ever
    if odd:
        raise UserError(f"{odd[0]} is not a regular file (a pipe, a device or a folder); a run folder's tables "
                        "are files parbench wrote: move it aside")
    check_table(path, files, lambda: [_footer(f) for f in files])
    try:
        # One dataset over every part (read in parallel). Every part of one writer has one schema
        # (the registry's); a resumed run appends parts whose schema may add columns, so the first
        # and the last part's schemas are unified (reading all of them costs a second per 1,000).
        ends = [files[0]] if len(files) == 1 else [files[0], files[-1]]
        unified = pa.unify_schemas([pq.read_schema(f) for f in ends], promote_options="permissive")
        df = _pandas(ds.dataset([str(f) for f in files], schema=unified, format="parquet").to_table())
    except (OSError, pa.ArrowException):
        df = _read_parts_one_by_one(files)
    if name == "cells":
        df = latest_rows(df)
    return frame(df, schema, source=str(path)) if schema else df


def latest_rows(cells: pd.DataFrame) -> pd.DataFrame:
    """One row per cell: a cell measured again (the run's adaptive repeats) has a later row with
    every repeat so far, which supersedes the earlier one; the row with the most repeats is kept
    (the later of equals), whatever the order its parts were read in."""
    if "cell_id" not in cells or not cells["cell_id"].duplicated().any():
        return cells
    done = cells["repeats_done"] if "repeats_done" in cells else pd.Series(0, index=cells.index)
    order = pd.DataFrame({"cell_id": cells["cell_id"], "n": pd.to_numeric(done, errors="coerce").fillna(-1),
                          "pos": range(len(cells))}, index=cells.index)
    keep = order.sort_values(["cell_id", "n", "pos"]).groupby("cell_id", sort=False).tail(1).index
    return cells.loc[cells.index.isin(keep)].reset_index(drop=True)


def _pandas(table: pa.Table) -> pd.DataFrame:
    """A table as a frame, its pandas metadata ignored: column types come from parbench's schema
    (:func:`frame`), never from the file (docs/guides/trust.md)."""
    return table.to_pandas(ignore_metadata=True)


def _unreadable(f: Path, e: BaseException) -> UserError:
    return UserError(f"{f} cannot be read ({type(e).__name__}: {' '.join(str(e).split())[:120]}); "
                     "move it aside to load the rest of the run")


def _footer(f: Path) -> tuple[int, int]:
    """(rows, decoded bytes) a part declares in its footer, read before any of its data."""
    try:
        md = pq.read_metadata(f)
        return md.num_rows, sum(md.row_group(i).total_byte_size for i in range(md.num_row_groups))
    except (OSError, pa.ArrowException) as e:
        raise _unreadable(f, e) from None


def _read_parts_one_by_one(files: list[Path]) -> pd.DataFrame:
    """Slow path that names the part which cannot be read; parts whose column types disagree (one
    written by another tool) are joined as frames, and :func:`frame` types each column."""
    tables = []
    for f in files:
        try:
            tables.append(pq.read_table(f))
        except (OSError, pa.ArrowException) as e:
            raise _unreadable(f, e) from None
    try:
        return _pandas(pa.concat_tables(tables, promote_options="permissive"))
    except pa.ArrowException:
        return pd.concat([_pandas(t) for t in tables], ignore_index=True)


def _git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5)
        if out.returncode:
            return None
        return out.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def machine_meta() -> dict[str, Any]:
    """Versions and hardware, for meta.json (cheap: no process group, no NCCL init)."""
    import torch


    meta: dict[str, Any] = {
        "host": socket.gethostname(), "platform": platform.platform(), "python": sys.version.split()[0],
        "torch": torch.__version__, "cuda": torch.version.cuda, "parbench": __version__,
        "gpus": gpu_names(), "gpu_count": gpu_count(),
    }
    try:
        meta["nccl"] = ".".join(map(str, torch.cuda.nccl.version())) if meta["gpu_count"] else None
    except Exception:  # noqa: BLE001
        meta["nccl"] = None
    try:
        import pynvml

        pynvml.nvmlInit()
        meta["driver"] = pynvml.nvmlSystemGetDriverVersion()
        pynvml.nvmlShutdown()
    except Exception as e:  # noqa: BLE001 - no NVML is normal on CPU machines
        meta["driver"] = None
        meta["nvml_unavailable"] = f"{type(e).__name__}: {e}"

    meta["fingerprint"] = fingerprint()
    return meta


def command_line(argv: list[str] | None = None) -> list[str]:
    """The command as a user would type it again: ``parbench ...`` whether it ran as the
    ``parbench`` script or as ``python -m bench`` (whose argv[0] is bench/__main__.py)."""
    argv = list(sys.argv if argv is None else argv)
    if argv and (Path(argv[0]).name == "parbench" or Path(argv[0]).as_posix().endswith("bench/__main__.py")):
        argv[0] = "parbench"
    return argv


def write_meta(run_dir: Path, config: dict[str, Any], **more: Any) -> dict[str, Any]:
    meta = {
        "schema_version": SCHEMA_VERSION, "run_id": run_dir.name,
        "created_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "git_commit": _git_commit(), "command_line": command_line(), "config": config,
        **machine_meta(), **more,
    }
    old = run_dir / "meta.json"
    if old.is_file():  # rewritten at the end of a run: keep when it started
        try:
            meta["created_utc"] = json.loads(old.read_text()).get("created_utc", meta["created_utc"])
        except (OSError, ValueError):
            pass
    meta["updated_utc"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    tmp = run_dir / ".meta.json.tmp"
    try:  # whole or not at all: a reader never sees half a meta.json
        tmp.write_text(json.dumps(meta, indent=2, default=str))
        os.replace(tmp, run_dir / "meta.json")
    except OSError as e:
        _unlink_quietly(tmp)
        raise UserError(f"cannot write {run_dir / 'meta.json'} ({os_reason(e)}); free space or pass a writable "
                        "--out") from None
    return meta
