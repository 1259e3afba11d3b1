"""A run folder read once: the :class:`Run` every reader takes (summary, terminal, report, compare,
history, the adaptive rounds, export, tools).

Opening a run checks its bounds (required columns, a status on every row, finite step times, the
types of meta.json's fields), upgrades what an older parbench wrote (:mod:`bench.results.migrate`)
and derives the columns that need other cells (parity and scaling, :mod:`bench.results.derived`).
No torch: a strategy's columns come from its declaration (:mod:`strategies.catalog`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Mapping
from datetime import datetime
from functools import cached_property
from pathlib import Path
from typing import Any

import pandas as pd

from bench import SCHEMA_VERSION
from bench.core.errors import UserError
from bench.results.bounds import check_meta_fields, check_times, read_json
from bench.results.columns import all_metrics
from bench.results.derived import derive
from bench.results.migrate import upgrade
from bench.results.store import CELL_COLUMNS, STEP_COLUMNS, frame, read_table, require_columns

#: meta.json fields parbench reads, and the JSON types each may have (null is always allowed)
META_FIELDS: dict[str, tuple[type, ...]] = {
    **dict.fromkeys(("run_id", "created_utc", "updated_utc", "git_commit", "host", "platform", "python", "plan",
                     "status", "mode"), (str,)),
    **dict.fromkeys(("torch", "nccl", "cuda"), (str, int, float)),
    **dict.fromkeys(("config", "workloads", "telemetry", "fingerprint", "serve_sweep"), (dict,)),
    **dict.fromkeys(("gpus", "group_starts", "adaptive"), (list,)),
    "schema_version": (int,), "gpu_count": (int,), "invoked_unix": (int, float),
}
#: the columns every training reader may count on (a folder from another tool may lack the rest)
READ_COLUMNS = ("cell_id", "workload", "strategy", "backend", "world_size", "status")
#: statuses of a cell that ran (as opposed to one skipped at plan time)
RAN = ("ok", "failed", "timeout")


class Meta(Mapping[str, Any]):
    """meta.json of a run, its fields of :data:`META_FIELDS` typed; ``meta["key"]`` and
    ``meta.get`` read any field, known or not."""

    def __init__(self, raw: Mapping[str, Any] | None = None):
        self._raw = dict(raw or {})

    def __getitem__(self, key: str) -> Any:
        return self._raw[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._raw)

    def __len__(self) -> int:
        return len(self._raw)

    @property
    def config(self) -> dict[str, Any]:
        return self._raw.get("config") or {}

    @property
    def budget(self) -> str | None:
        """The run's time budget as given ("10m"), None for an unbudgeted run."""
        return self.config.get("budget") or None

    @property
    def schema_version(self) -> int | None:
        return self._raw.get("schema_version")

    @property
    def group_starts(self) -> list[dict[str, Any]]:
        return [g for g in self._raw.get("group_starts") or [] if isinstance(g, dict)]

    @property
    def started_unix(self) -> float:
        """When this invocation started (``invoked_unix``; a folder without it: its creation)."""
        return float(self._raw.get("invoked_unix") or datetime.fromisoformat(self._raw["created_utc"]).timestamp())

    @property
    def took_s(self) -> float:
        """Seconds from this invocation's start to the folder's last update: the run's wall time
        (KeyError or ValueError where meta.json lacks the times)."""
        return datetime.fromisoformat(self._raw["updated_utc"]).timestamp() - self.started_unix

    @property
    def adaptive(self) -> list[dict[str, Any]] | None:
        rounds = self._raw.get("adaptive")
        return [r for r in rounds if isinstance(r, dict)] if isinstance(rounds, list) else None


class Run:
    """One run folder's cells (one row per cell, every column typed, upgraded and derived), steps
    and metadata, with the views its readers share. Unpacks, and indexes, as ``cells, steps, meta``."""

    def __init__(self, cells: pd.DataFrame, steps: pd.DataFrame | None = None, meta: Mapping[str, Any] | None = None,
                 *, path: Path | None = None, upgraded: tuple[str, ...] = ()):
        self.cells = cells
        self.steps = steps if steps is not None else frame([], STEP_COLUMNS)
        self.meta = meta if isinstance(meta, Meta) else Meta(meta)
        self.path = path
        self.upgraded = upgraded  # the steps of bench.results.migrate that changed this run
        self._tables: dict[str, pd.DataFrame] = {}

    @classmethod
    def open(cls, run_dir: str | os.PathLike) -> Run:
        """The run folder ``run_dir``; a one-line UserError if it is not one."""
        d = Path(run_dir)
        _check_is_run(d)
        cells = read_table(d, "cells")
        steps = read_table(d, "steps", STEP_COLUMNS)
        meta = load_meta(d)
        _warn_if_newer(d, meta)
        return cls.from_frames(cells, steps, meta, path=d)

    @classmethod
    def from_frames(cls, cells: pd.DataFrame, steps: pd.DataFrame | None = None,
                    meta: Mapping[str, Any] | None = None, *, path: Path | None = None) -> Run:
        """A run from tables already in memory (a history's stored runs, a test's rows), checked,
        upgraded and derived as :meth:`open` does."""
        where = str(path / "cells.parquet") if path else "the cells table"
        require_columns(cells, list(READ_COLUMNS), where)
        missing = cells["cell_id"][cells["status"].isna()]
        if len(missing):  # every row parbench writes has one: this table was edited or damaged
            raise UserError(f"{where}: cell(s) {', '.join(map(str, list(missing)[:5]))} have no status; "
                            "restore the run folder or move the damaged part aside")
        cells, done = upgrade(cells)
        cells = frame(cells, {m.name: m.dtype for m in all_metrics() if m.name in cells}, source=where)
        steps = steps if steps is not None else frame([], STEP_COLUMNS)
        check_times(cells, [c for c in cells.columns if c.startswith("step_time_")], where)
        check_times(steps, ["step_time_s"], str(path / "steps.parquet") if path else "the steps table")
        cells = derive(cells, steps)
        order = [c for c in CELL_COLUMNS if c in cells] + [c for c in cells.columns if c not in CELL_COLUMNS]
        cells = cells[order].sort_values("cell_id", kind="stable").reset_index(drop=True)
        return cls(cells, steps, meta, path=path, upgraded=done)

    def __iter__(self) -> Iterator[Any]:
        return iter((self.cells, self.steps, self.meta))

    def __getitem__(self, i: int) -> Any:
        """``run[0]`` is the cells, ``run[1]`` the steps, ``run[2]`` the meta (as the tuple scripts read)."""
        return (self.cells, self.steps, self.meta)[i]

    @cached_property
    def training(self) -> pd.DataFrame:
        """The training cells (every mode but serving: a row without a mode is a training row)."""
        if "mode" not in self.cells:
            return self.cells
        return self.cells[self.cells["mode"].fillna("train") != "serve"]

    @cached_property
    def serving(self) -> pd.DataFrame:
        if "mode" not in self.cells:
            return self.cells.iloc[:0]
        return self.cells[self.cells["mode"] == "serve"]

    def trained(self, command: str) -> Run:
        """This run, if it holds training cells; else (a folder of ``parbench serve``) a one-line
        UserError saying what the folder is and what ``command`` reads."""
        if len(self.serving) and not len(self.training):
            raise UserError(f"{self.path} is a serving run's folder (parbench serve): {command} reads the step times "
                            f"of parbench run's folders, which it has none of; its requests and latencies are in "
                            f"parbench report {self.path}")
        return self

    @cached_property
    def ran(self) -> pd.DataFrame:
        """The cells that ran (ok, failed or timed out), not those skipped at plan time."""
        return self.cells[self.cells["status"].isin(RAN)]

    def table(self, name: str, schema: dict[str, str] | None = None) -> pd.DataFrame:
        """Another table of the run folder (samples, comm, collectives, serve_tenants), read once;
        empty (with ``schema``'s columns) when the run has none or is not on disk."""
        if name not in self._tables:
            self._tables[name] = (read_table(self.path, name, schema) if self.path is not None
                                  else frame([], schema or {}))
        return self._tables[name]

    def has_table(self, name: str) -> bool:
        return self.path is not None and (self.path / f"{name}.parquet").exists()


def load_run(run_dir: str | os.PathLike | Run) -> Run:
    """The :class:`Run` of a run folder (a Run passes through): unpacks as ``cells, steps, meta``."""
    return run_dir if isinstance(run_dir, Run) else Run.open(run_dir)


def load_meta(d: str | os.PathLike) -> Meta:
    """meta.json of a run folder (empty without one), within the size and nesting bounds of
    :mod:`bench.results.bounds` and with the fields of :data:`META_FIELDS` of their types."""
    p = Path(d) / "meta.json"
    if not p.is_file():
        return Meta()
    meta = read_json(p, "restore it or delete it to load the run without metadata")
    if not isinstance(meta, dict):
        raise UserError(f"{p} holds a JSON {type(meta).__name__}, not an object; delete it to load the run")
    check_meta_fields(meta, p, META_FIELDS)
    return Meta(meta)


def _check_is_run(d: Path) -> None:
    if not (d / "cells.parquet").exists() and (d / "collectives.parquet").exists():
        raise UserError(f"{d} is a collective sweep's folder (parbench comm), which has no cells: this command reads "
                        f"the folders of parbench run and parbench serve; read the sweep with "
                        f"pandas.read_parquet('{d / 'collectives.parquet'}')")
    if not (d / "cells.parquet").exists():
        raise UserError(f"{d} is not a parbench run folder (no cells.parquet); pass results/<run-id>")


def _warn_if_newer(d: Path, meta: Meta) -> None:
    newer = meta.schema_version
    if isinstance(newer, int) and newer > SCHEMA_VERSION:
        logging.getLogger("parbench").warning(
            "%s was written by a newer parbench (schema %d; this one reads %d): columns it does not know are "
            "passed through unread and derived ones may be wrong; upgrade parbench to read it", d, newer,
            SCHEMA_VERSION)
