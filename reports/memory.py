"""The memory section of a workload in the report: the memory model's prediction of every cell
against what was measured, as a compact table (the figure is :func:`reports.figures.memory_bars`;
the sentences are :mod:`reports.words`'). Only drawn for runs whose rows carry a prediction.
"""

from __future__ import annotations

import pandas as pd

from bench.decide.fits import footprint
from bench.decide.rules import num, text
from reports.figures import cell_label

GIB = 2**30
HEAD = ("cell", "status", "peak at", "predicted GiB", "measured GiB", "error", "reserved error",
        "counted / predicted", "fits b/dev", "how")
NUMERIC = frozenset(HEAD[3:9])


def _gib(v: float | None) -> str:
    """Bytes as GiB with three significant digits ('-' for none): a CPU toy's 5 MB is 0.00504."""
    return "-" if v is None else f"{v / GIB:.3g}"


def _err(v) -> str:
    v = num(v)
    return "-" if v is None else f"{v:+.0%}"


def _counted(r: pd.Series) -> str:
    """The parameters, gradients and state counted on the rank over their prediction, less one."""
    held = [num(r.get(f"held_{k}_bytes")) for k in ("params", "grads", "optimizer")]
    pred = sum(num(r.get(f"mem_pred_{k}_bytes")) or 0.0 for k in ("params", "grads", "optimizer"))
    return "-" if None in held or not pred else f"{sum(held) / pred - 1:+.0%}"


def memory_table(cells: pd.DataFrame, workload: str) -> dict | None:
    """The table of ``workload``'s cells that have a prediction (in their columns, or in the reason the
    planner skipped them with): head, rows and the numeric headers; None when none has one."""
    rows = []
    for _, r in cells[cells["workload"] == workload].sort_values(["world_size", "strategy"]).iterrows():
        fp = footprint(r)
        if fp is None:
            continue
        how = text(r.get("mem_pred_how")) or ("the planner's reason" if text(r.get("reason")) else "")
        measured = num(r.get("peak_mem_bytes"))
        fits = "-" if fp.batch_fits is None else str(fp.batch_fits)
        rows.append([cell_label(r), text(r.get("status")), fp.at, _gib(fp.allocated), _gib(measured),
                     _err(r.get("mem_pred_error")), _err(r.get("mem_pred_reserved_error")), _counted(r), fits, how])
    return {"head": HEAD, "rows": rows, "numeric": NUMERIC} if rows else None
