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
from bench.gate.compare import compare, parse_threshold
from bench.gate.history import baseline as history_baseline
from bench.gate.history import fingerprint, read_index
from bench.results.store import load_run
from bench.stats.ranktests import ALPHA

#: the step-time slowdown that fails when none is given
DEFAULT_THRESHOLD = "5%"


@dataclass(frozen=True, kw_only=True)
class Gate:
    """What turns a comparison into verdicts; the defaults are ``parbench compare``'s."""

    threshold: float = parse_threshold(DEFAULT_THRESHOLD)
    alpha: float = ALPHA
    test: str = "mannwhitneyu"
    # a cell measured once a side is at most noisy: one run's steps do not show run-to-run drift
    require_repeats: bool = True
    # with a history: a regression on fewer runs than this is reported as noisy
    fail_from_runs: int = 0


@dataclass(frozen=True)
class Judged:
    """The comparison's table (:func:`bench.gate.compare.compare`'s columns), what it was made
    against in words, and the history's machine (None against a run)."""

    table: pd.DataFrame
    against: str
    machine: str | None = None


def judge(current: str | os.PathLike, *, baseline: str | os.PathLike | None = None,
          history: str | os.PathLike | None = None, machine: str | None = None, gate: Gate = Gate(),
          loaded: tuple[pd.DataFrame, pd.DataFrame, dict] | None = None) -> Judged:
    """Compare the run folder ``current`` with the run folder ``baseline`` or with the last stable
    values of the history store ``history`` (its ``machine``, by default CURRENT's fingerprint).
    ``loaded`` is ``load_run(current)`` when the caller already holds it. Raises UserError when
    nothing could be compared."""
    if (baseline is None) == (history is None):
        raise UserError("compare with a baseline run or a history, one of the two")
    cur, cur_steps, cur_meta = loaded if loaded is not None else load_run(current)
    kw = dict(cur_steps=cur_steps, cur_meta=cur_meta, alpha=gate.alpha, test=gate.test,
              require_repeats=gate.require_repeats)
    if baseline is not None:
        if gate.fail_from_runs:
            raise UserError(f"--fail-from-runs {gate.fail_from_runs} applies to --history only; drop it or add "
                            "--history DIR")
        base, base_steps, base_meta = load_run(baseline)
        table = compare(base, cur, gate.threshold, base_steps=base_steps, base_meta=base_meta, **kw)
        return Judged(table, str(baseline))
    machine = machine or fingerprint(cur_meta)
    known = read_index(history)["machine"].unique().tolist()
    if not known:
        raise UserError(f"{history} holds no history; add runs with: parbench history add RUN --store {history}")
    if machine not in known:
        raise UserError(f"{history} has no runs of machine {machine} (CURRENT's fingerprint); known: "
                        f"{', '.join(known) or 'none'}; pass --machine NAME or add a baseline from this machine")
    base, base_samples, base_meta = history_baseline(history, machine)
    table = compare(base, cur, gate.threshold, base_samples=base_samples, base_meta=base_meta,
                    fail_from_runs=gate.fail_from_runs, **kw)
    return Judged(table, f"the history in {Path(history)}", machine)
