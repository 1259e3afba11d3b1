"""Every upgrade of what an older parbench wrote, in one place: a run folder is read as this
version's schema, one function per step, each saying what it fills in.

The steps run in order on every read (:func:`upgrade`); one that finds nothing to do changes
nothing, so a folder written by this version passes through unchanged. The file layout (a table as
one file from the oldest versions, a compaction cut between its renames) is the table reader's
(:func:`bench.results.store.read_table`); what the rows say is here.
"""

from __future__ import annotations

from collections.abc import Callable

import pandas as pd

from bench.core import knobs
from strategies.catalog import DECLARED


def serve_status(cells: pd.DataFrame) -> bool:
    """Serving cells of the first serving versions say "error" for "failed": one status vocabulary
    for every mode."""
    old = cells["status"] == "error"
    if not old.any():
        return False
    cells.loc[old, "status"] = "failed"
    return True


def training_knobs(cells: pd.DataFrame) -> bool:
    """Training rows recorded before the training knobs existed trained with
    :func:`bench.core.knobs.legacy` (SGD, eager, no checkpointing); rows of other modes stay without."""
    train = cells["mode"].fillna("train") == "train" if "mode" in cells else pd.Series(True, index=cells.index)
    changed = False
    for name, value in knobs.legacy().items():
        if name not in cells:
            cells[name] = pd.Series(pd.NA, index=cells.index, dtype="string")
        gap = train & cells[name].isna()
        if gap.any():
            cells.loc[gap, name] = value
            changed = True
    return changed


def roles(cells: pd.DataFrame) -> bool:
    """Rows written before the ``role`` column take their built-in strategy's declared role (the
    one-device reference, independent models)."""
    if "strategy" not in cells:
        return False
    if "role" not in cells:
        cells["role"] = pd.Series(pd.NA, index=cells.index, dtype="string")
    gap = cells["role"].isna() & cells["strategy"].isin(list(DECLARED))
    if not gap.any():
        return False
    cells.loc[gap, "role"] = cells.loc[gap, "strategy"].map(lambda s: DECLARED[s].role)
    return True


def repeats_done(cells: pd.DataFrame) -> bool:
    """Rows written before ``repeats_done`` ran every repeat they asked for."""
    if "repeats" not in cells or ("repeats_done" in cells and cells["repeats_done"].notna().all()):
        return False
    if "repeats_done" not in cells:
        cells["repeats_done"] = pd.Series(pd.NA, index=cells.index, dtype="Int64")
    gap = cells["repeats_done"].isna() & cells["repeats"].notna() & (cells["status"] == "ok")
    if not gap.any():
        return False
    cells.loc[gap, "repeats_done"] = cells.loc[gap, "repeats"]
    return True


#: The steps, oldest first: (name, function). A function fills in its columns in place and says
#: whether it changed anything.
STEPS: tuple[tuple[str, Callable[[pd.DataFrame], bool]], ...] = (
    ("serve status error -> failed", serve_status),
    ("training knobs of runs before them", training_knobs),
    ("role from the strategy's declaration", roles),
    ("repeats_done of runs before it", repeats_done),
)


def upgrade(cells: pd.DataFrame) -> tuple[pd.DataFrame, tuple[str, ...]]:
    """``cells`` read as this version's schema, and the names of the steps that changed it."""
    cells = cells.copy()
    done = tuple(name for name, step in STEPS if step(cells))
    return cells, done
