"""A run's results folder on disk: checked before anything launches, and, for a resumed run, the
cells it already has rows for and the parts of cells that have none.
"""

from __future__ import annotations

import os
from pathlib import Path

from bench.core.errors import UserError
from bench.core.paths import folder_problem
from bench.results.store import read_table


def check_out(out: str) -> None:
    """The results folder can be created and written, before anything launches; a one-line
    UserError naming the value and the fix otherwise."""
    p = Path(out)
    for part in p.parts:
        if len(os.fsencode(part)) > 255:
            raise UserError(f"--out {out[:40]!r}...: the name {part[:20]!r}... is {len(os.fsencode(part))} bytes, over "
                            "the file system's 255; pass a shorter folder name")

    why = folder_problem(p)
    if why == "it is a file":
        raise UserError(f"--out {out!r} is a file, not a folder; pass a folder, e.g. --out results")
    if why:
        raise UserError(f"--out {out!r} is not writable ({why}); pass a folder you can write to")


def finished_cells(run_dir: Path) -> set[int]:
    """cell_ids that already have a row in a run folder (any status: a row is final)."""

    cells = read_table(run_dir, "cells")
    if cells.empty or "cell_id" not in cells:
        return set()
    return {int(c) for c in cells["cell_id"].dropna()}


def set_aside_orphans(run_dir: Path, done: set[int], to: Path) -> list[Path]:
    """Steps and comm parts of cells that have no row (the run was killed between a cell's parts
    and its row) move to ``to``: the cell runs again, and its rows must not appear twice."""
    import pyarrow.parquet as pq

    moved = []
    for table in ("steps", "comm"):
        for part in sorted((run_dir / f"{table}.parquet").glob("part-*.parquet")):
            try:
                ids = set(pq.read_table(part, columns=["cell_id"]).column("cell_id").to_pylist())
            except Exception:  # noqa: BLE001 - an unreadable part is read_table's to report, by name
                continue
            if ids and not ids & done:
                to.mkdir(parents=True, exist_ok=True)
                dest = to / f"{table}-{part.name}"
                os.replace(part, dest)
                moved.append(dest)
    return moved
