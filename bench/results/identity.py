"""The row start every mode shares: a planned cell's identity, its outcome and its wall time.

Light on purpose (the contracts of :mod:`bench.core.spec` and nothing else), so that the ranks of a
collective sweep build their rows through it without the statistics behind
:mod:`bench.results.rows`.
"""

from __future__ import annotations

from typing import Any

from bench.core.spec import CellKey, outcome


def start_row(spec: CellKey, *, status: str | None = "ok", reason: str | None = None, wall_s: float | None = None,
              **columns: Any) -> dict[str, Any]:
    """The row a cell of any mode starts from: the spec's identity columns, then the mode's own
    ``columns``, its outcome in the one status vocabulary (:func:`bench.core.spec.outcome`, which
    refuses an unknown status; ``status=None`` leaves it to the caller) and its wall time once known."""
    row = {**spec.identity(), **columns}
    if status is not None:
        row.update(outcome(status, reason))
    if wall_s is not None:
        row["cell_wall_s"] = wall_s
    return row
