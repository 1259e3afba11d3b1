"""One comparison of a run with a baseline run or a history, for every command that shows one.

``parbench compare`` and the report's baseline section both call :func:`judge` with a :class:`Gate`
(threshold, alpha, test, whether one run's steps may fail): the same pair, loaded the same way, gets
the same verdicts, shifts and medians on the terminal, in CI's files and on the page.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from bench.core.errors import UserError
from bench.gate.compare import DEFAULT_THRESHOLD, Gate, Side, compare

__all__ = ["DEFAULT_THRESHOLD", "Gate", "Judged", "judge"]
from bench.gate.history import baseline as history_baseline
from bench.gate.history import fingerprint, read_index
from bench.results.run import Run, load_run


@dataclass(frozen=True)
class Judged:
    """The comparison's table (:func:`bench.gate.compare.compare`'s columns), what it was made
    against in words, and the history's machine (None against a run)."""

    table: pd.DataFrame
    against: str
    machine: str | None = None


def judge(current: Run | str | os.PathLike, *, baseline: str | os.PathLike | None = None,
          history: str | os.PathLike | None = None, machine: str | None = None, gate: Gate | None = None) -> Judged:
    """Compare the run ``current`` (a :class:`Run` or its folder) with the run folder ``baseline``
    or with the last stable values of the history store ``history`` (its ``machine``, by default
    CURRENT's fingerprint). Raises UserError when nothing could be compared."""
    if (baseline is None) == (history is None):
        raise UserError("compare with a baseline run or a history, one of the two")
    gate = gate or Gate()
    cur = load_run(current).trained("compare")
    if baseline is not None:
        if gate.fail_from_runs:
            raise UserError(f"--fail-from-runs {gate.fail_from_runs} applies to --history only; drop it or add "
                            "--history DIR")
        return Judged(compare(load_run(baseline).trained("compare"), cur, gate), str(baseline))
    machine = machine or fingerprint(cur.meta)
    known = read_index(history)["machine"].unique().tolist()
    if not known:
        raise UserError(f"{history} holds no history; add runs with: parbench history add RUN --store {history}")
    if machine not in known:
        raise UserError(f"{history} has no runs of machine {machine} (CURRENT's fingerprint); known: "
                        f"{', '.join(known) or 'none'}; pass --machine NAME or add a baseline from this machine")
    base, base_samples, base_meta = history_baseline(history, machine)
    table = compare(Side(base, meta=base_meta, samples=base_samples), cur, gate)
    return Judged(table, f"the history in {Path(history)}", machine)
