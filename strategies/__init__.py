"""Parallelism strategies: one file a strategy, their declarations in :mod:`strategies.catalog`
(no torch), the classes in :mod:`strategies.registry`.

``strategies.REGISTRY``, ``strategies.get`` and the protocol names load the registry (and torch)
on first use, so that ``import strategies.catalog`` stays light.
"""

from __future__ import annotations

import importlib
from typing import Any

_REGISTRY_NAMES = frozenset({"REGISTRY", "Context", "Option", "Step", "Strategy", "get", "names"})
__all__ = sorted(_REGISTRY_NAMES)


def __getattr__(name: str) -> Any:
    if name in _REGISTRY_NAMES:
        return getattr(importlib.import_module("strategies.registry"), name)
    raise AttributeError(f"module 'strategies' has no attribute {name!r}")
