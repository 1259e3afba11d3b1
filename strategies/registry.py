"""The strategy registry: adding a strategy is one file, its declaration in :mod:`strategies.catalog`,
one line here and one parity test.

A user's own strategy enters as ``package.module:Class`` (a :class:`strategies.base.Strategy`).
"""

from __future__ import annotations

import importlib

from bench.core.errors import UserError
from strategies.allreduce import AllReduce, AllReduceBucketed
from strategies.base import Context, Option, Step, Strategy
from strategies.chain import Chain, EncoderHead, LayerSplit
from strategies.dataparallel import DataParallel
from strategies.ddp import DDPStrategy, DDPZero1
from strategies.ensemble import Ensemble
from strategies.fsdp import FSDP, FSDPNoReshard
from strategies.hybrid import FSDPxTP
from strategies.pipeline import DPxPipeline, Pipeline, Pipeline1F1B, PipelineInterleaved
from strategies.single import Single
from strategies.tensor import TensorParallel

REGISTRY: dict[str, type[Strategy]] = {
    cls.name: cls
    for cls in (
        Single,
        DataParallel,
        DDPStrategy,
        DDPZero1,
        AllReduce,
        AllReduceBucketed,
        FSDP,
        FSDPNoReshard,
        LayerSplit,
        Chain,
        Pipeline,
        Pipeline1F1B,
        PipelineInterleaved,
        TensorParallel,
        DPxPipeline,
        FSDPxTP,
        Ensemble,
        EncoderHead,
    )
}

__all__ = ["REGISTRY", "Context", "Option", "Step", "Strategy", "get", "names"]


def names() -> list[str]:
    return list(REGISTRY)


def get(spec: str) -> Strategy:
    """A strategy instance by registry name or ``package.module:Class``."""
    if spec in REGISTRY:
        return REGISTRY[spec]()
    if ":" not in spec:
        raise UserError(f"unknown strategy {spec!r}: use one of {', '.join(REGISTRY)}, 'all', "
                        "or 'package.module:Class'")
    mod_name, _, attr = spec.partition(":")
    try:
        cls = getattr(importlib.import_module(mod_name), attr)
    except Exception as e:  # noqa: BLE001
        raise UserError(f"strategy {spec!r}: cannot load ({type(e).__name__}: {e}); "
                        "check the module is on PYTHONPATH") from None
    if not (isinstance(cls, type) and issubclass(cls, Strategy)):
        raise UserError(f"strategy {spec!r} is not a strategies.base.Strategy subclass")
    inst = cls()
    if not getattr(inst, "name", None):
        raise UserError(f"strategy {spec!r} has no name")
    return inst
