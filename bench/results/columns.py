"""Every column the cells table can have: the core metrics, each built-in strategy's declared ones and
the serving ones. What the summary, the report and compare read to name, order and format columns.
The strategies' columns come from their declarations (strategies.catalog), so this needs no torch."""

from __future__ import annotations

from collections.abc import Iterable

from bench.core.metrics import CORE, Metric, registry
from bench.results.serve_columns import SERVE_METRICS
from strategies.catalog import DECLARED


def all_metrics() -> list[Metric]:
    """The registry over every built-in strategy (what the summary, report and compare read)."""
    return registry([*(m for d in DECLARED.values() for m in d.columns()), *SERVE_METRICS])


def lookup(name: str, metrics: Iterable[Metric] | None = None) -> Metric | None:
    for m in metrics if metrics is not None else all_metrics():
        if m.name == name:
            return m
    return None


def key_columns(columns: Iterable[str]) -> list[str]:
    """The columns that identify a cell across runs: the core keys and any strategy label present."""
    cols = list(columns)
    keys = [m.name for m in CORE if m.kind == "key"]
    labels = [m.name for m in all_metrics() if m.kind == "label" and m.name in cols]
    return keys + labels


def shown(where: str, columns: Iterable[str] | None = None) -> list[Metric]:
    """Metrics shown in ``where`` ('summary' or 'report'), in registry order, restricted to columns
    present when given."""
    cols = None if columns is None else set(columns)
    return [m for m in all_metrics() if where in m.shown and (cols is None or m.name in cols)]
