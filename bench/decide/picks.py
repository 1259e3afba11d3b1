"""A run's decisions, made once and kept in its folder (``picks.json``).

The end of ``parbench run`` decides once (:func:`decide`), stores the decisions beside the tables
(:func:`store`), and the terminal and the report render that one list. ``parbench report`` of a
folder reads them back (:func:`of`); a folder without them (written by an older parbench, or a
run stopped before its end), or whose cells changed since (a resume stopped half-way), is decided
when read.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

from bench.decide.best import searched
from bench.decide.decision import Decision, decisions_from_json, decisions_to_json
from bench.decide.recommend import recommend
from bench.results.bounds import read_json
from bench.results.run import Run

FILE = "picks.json"
log = logging.getLogger("parbench")


#: what a decision reads of each cell: a change in any of them makes the stored decisions stale
SIGNED = ("cell_id", "status", "repeats_done", "step_time_median_s", "parity_ok", "stable")


def signature(run: Run) -> str:
    """A digest of the cells the decisions were made on."""
    cols = [c for c in SIGNED if c in run.cells]
    return hashlib.sha256(run.cells[cols].to_csv(index=False).encode()).hexdigest()[:16]


def decide(run: Run, gpu_mem: float | None = None, searched_ids: set[int] | None = None) -> list[Decision]:
    """The decisions of ``run``'s training cells (``gpu_mem``: a device's bytes, for the headroom),
    the knob search's aside (its cells, from meta.json, or ``searched_ids`` while the run is still
    writing it): they answer which configuration (:mod:`bench.decide.best`), these which strategy
    at the run's own settings."""
    cells = run.training
    return recommend(cells[~cells["cell_id"].isin(searched(run.meta) | (searched_ids or set()))], gpu_mem)


def store(run: Run, decisions: list[Decision]) -> Path | None:
    """Write ``decisions`` to RUN/picks.json (whole or not at all); None for a run not on disk, or
    a folder that cannot take the file (a full disk: the decisions are made again when read)."""
    if run.path is None:
        return None
    path = Path(run.path) / FILE
    tmp = path.with_name(f".{FILE}.partial")
    try:
        tmp.write_text(json.dumps({**decisions_to_json(decisions), "cells": signature(run)}, indent=1) + "\n")
        os.replace(tmp, path)
    except OSError as e:
        log.warning("%s not written (%s); the report decides again from the cells", path, e.strerror or e)
        tmp.unlink(missing_ok=True)
        return None
    return path


def load(run: Run) -> list[Decision] | None:
    """The decisions stored in ``run``'s folder, or None where there are none this version reads."""
    if run.path is None or not (Path(run.path) / FILE).is_file():
        return None
    data = read_json(Path(run.path) / FILE, "delete it: the decisions are made again from the cells")
    if not isinstance(data, dict) or data.get("cells") != signature(run):
        return None  # decided on other cells: again, from these
    try:
        return decisions_from_json(data)
    except (ValueError, TypeError, KeyError):
        return None  # another schema, or edited: decided again from the cells


def of(run: Run) -> list[Decision]:
    """``run``'s decisions: the stored ones, else made now."""
    stored = load(run)
    return stored if stored is not None else decide(run)

