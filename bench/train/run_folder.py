"""A training run's folder: opened new or for a resume, its telemetry samples and each launch's
start-up record.

The rows themselves are :mod:`bench.results.store`'s, meta.json's life is the run's
:class:`bench.results.session.RunSession`; this module holds what the launcher writes beside them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.core.errors import UserError
from bench.core.metrics import Metric
from bench.core.settings import RunConfig
from bench.results.folder import check_out, finished_cells, set_aside_orphans
from bench.results.store import RunWriter, cell_columns, new_run_id, os_reason


def open_run(cfg: RunConfig, metrics: list[Metric], resume: Path | None) -> tuple[Path, RunWriter, Path, set[int]]:
    """(run folder, writer, work folder, cell_ids already done): a new run, or the folder of a run
    to resume (appended to; its earlier work files kept)."""
    if resume is None:
        check_out(cfg.output.out)
        # absolute: every path the ranks get stays valid whatever their working directory
        run_dir = Path(os.path.abspath(cfg.output.out)) / new_run_id()
        writer = RunWriter(run_dir, cell_schema=cell_columns(metrics))
        work = run_dir / "work"
        _make(work, f"free space or pass a writable --out (the empty run folder {run_dir} can go)")
        return run_dir, writer, work, set()
    run_dir = Path(resume)
    writer = RunWriter(run_dir, cell_schema=cell_columns(metrics), resume=True)  # locked before it is read
    done = finished_cells(run_dir)
    n = 1 + sum(1 for _ in (run_dir / "work").glob("resume*"))
    work = run_dir / "work" / f"resume{n}"
    _make(work, f"free space and run parbench run --resume {run_dir} again")
    set_aside_orphans(run_dir, done, work / "orphans")
    return run_dir, writer, work, done


def _make(folder: Path, fix: str) -> None:
    """``folder`` created (parents too), or a one-line UserError with ``fix``."""
    try:
        folder.mkdir(parents=True)
    except OSError as e:
        raise UserError(f"cannot create {folder} ({os_reason(e)}); {fix}") from None


def earlier_starts(run_dir: Path) -> list[dict[str, Any]]:
    """The start-up records (``group_starts``) of the run a resume continues: they stay on record,
    before the resumed run's own."""
    try:
        return list(json.loads((run_dir / "meta.json").read_text()).get("group_starts") or [])
    except (OSError, ValueError):
        return []


class Telemetry:
    """The launcher's view of the sampler: new rows since the last cell, appended per cell. On a
    multi-node run, ``remote`` returns the rows the other nodes shipped (each with its ``node``)."""

    def __init__(self, sampler, writer: RunWriter, remote: Callable[[], list[dict[str, Any]]] | None = None):
        self.sampler, self.writer, self.remote = sampler, writer, remote
        self.pending: list[dict[str, Any]] = []

    def take(self) -> list[dict[str, Any]]:
        """Samples since the last call (also kept for the cell's telemetry window)."""
        if self.sampler is None:
            return []
        self.pending = [{**r, "node": 0} for r in self.sampler.drain()]
        if self.remote is not None:
            self.pending += self.remote()
        return self.pending

    def flush(self) -> None:
        self.writer.append("samples", self.pending)
        self.pending = []

    def last(self) -> None:
        """The rows left once the sampler stopped (and the other nodes' last), to the samples table."""
        self.take()
        self.flush()


def startup_record(label: str, attempt: int, launched: float, marks: dict[str, float | None],
                   prefix: Path) -> dict[str, Any]:
    """Where one launch's time outside its cells went, in seconds: from the launcher's Popen to the
    leader's process (torchrun's own start-up), its interpreter and imports, device, process group,
    placement and warm-up (the leader's marks, :func:`bench.train.events.write_startup`), then to the first
    cell's start; and from the last measured cell to torchrun's exit (teardown). The launcher's own
    work between two launches is the next one's ``launched_unix`` less this one's ``exited_unix``. A
    phase whose marks are missing (a launch that failed early) is left out."""
    rec: dict[str, Any] = {"group": label, "attempt": attempt, "launched_unix": round(launched, 3),
                           "exited_unix": round(marks["exited"], 3) if marks.get("exited") else None}
    try:
        worker = json.loads(Path(str(prefix) + "-leader.startup.json").read_text())
    except (OSError, ValueError):
        worker = {}
    at = {"launched": launched, **{k: worker.get(k) for k in ("process", "imported", "device", "process_group",
                                                             "placed", "warm")}, "first_cell": marks.get("first_cell")}
    # each phase between two marks, and only when both exist (a missing mark leaves its phases out
    # rather than folding them into a neighbour)
    for name, a, b in (("torchrun_s", "launched", "process"), ("imports_s", "process", "imported"),
                       ("device_s", "imported", "device"), ("process_group_s", "device", "process_group"),
                       ("placement_s", "process_group", "placed"), ("warm_up_s", "placed", "warm"),
                       ("to_first_cell_s", "warm", "first_cell")):
        if at.get(a) is not None and at.get(b) is not None:
            rec[name] = round(float(at[b]) - float(at[a]), 3)  # type: ignore[arg-type]
    if marks.get("first_cell") is not None:
        rec["start_s"] = round(float(marks["first_cell"]) - launched, 3)  # type: ignore[arg-type]
    if marks.get("last_cell") is not None and marks.get("exited") is not None:
        rec["teardown_s"] = round(float(marks["exited"]) - float(marks["last_cell"]), 3)  # type: ignore[arg-type]
    return rec
