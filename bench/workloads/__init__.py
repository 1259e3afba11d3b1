"""Workloads: a model, its data and its loss, with nothing about parallelism.

Every strategy runs the same workload: the same model (built from the seed), the same global batch
at every step (derived from the seed and the step number) and the same loss. A user's own workload
enters as ``package.module:factory``; the factory returns a :class:`Workload`.

The names below load torch on first use, so that :mod:`bench.workloads.catalog` (what ``parbench
list`` shows) stays light.
"""

from __future__ import annotations

import importlib
from typing import Any

_FROM = {**dict.fromkeys(("Batch", "Workload", "build_on", "display_name", "seeded", "shard"), "bench.workloads.base"),
         **dict.fromkeys(("names", "planned", "resolve"), "bench.workloads.registry")}
__all__ = sorted(_FROM)


def __getattr__(name: str) -> Any:
    if name in _FROM:
        return getattr(importlib.import_module(_FROM[name]), name)
    raise AttributeError(f"module 'bench.workloads' has no attribute {name!r}")
