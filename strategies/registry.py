"""The strategy registry: adding a strategy is one file, its declaration in :mod:`strategies.catalog`,
one line here and one parity test.

A user's own strategy enters as ``package.module:Class`` (a :class:`strategies.base.Strategy`).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping

from bench.core.errors import UserError
from strategies.base import Context, Option, Step, Strategy

#: each built-in strategy's class, as ``module:Class``; a module is imported when its strategy is
#: first asked for (FSDP's and the pipelines' pull in DTensor and dynamo: 3-4 s of a CPU rank's
#: start-up that a group of DDP cells has no use for)
_WHERE: dict[str, str] = {
    "single": "strategies.single:Single",
    "dataparallel": "strategies.dataparallel:DataParallel",
    "ddp": "strategies.ddp:DDPStrategy",
    "ddp-zero1": "strategies.ddp:DDPZero1",
    "allreduce": "strategies.allreduce:AllReduce",
    "allreduce-bucketed": "strategies.allreduce:AllReduceBucketed",
    "fsdp": "strategies.fsdp:FSDP",
    "fsdp-noreshard": "strategies.fsdp:FSDPNoReshard",
    "layersplit": "strategies.chain:LayerSplit",
    "chain": "strategies.chain:Chain",
    "pipeline-gpipe": "strategies.pipeline:Pipeline",
    "pipeline-1f1b": "strategies.pipeline:Pipeline1F1B",
    "pipeline-interleaved": "strategies.pipeline:PipelineInterleaved",
    "tensor": "strategies.tensor:TensorParallel",
    "dp-pp": "strategies.pipeline:DPxPipeline",
    "fsdp-tp": "strategies.hybrid:FSDPxTP",
    "ensemble": "strategies.ensemble:Ensemble",
    "encoder-head": "strategies.chain:EncoderHead",
}


class _Registry(Mapping[str, type[Strategy]]):
    """Built-in strategy classes by name, in :data:`_WHERE`'s order, each imported on first use."""

    def __getitem__(self, name: str) -> type[Strategy]:
        mod, _, attr = _WHERE[name].partition(":")
        return getattr(importlib.import_module(mod), attr)

    def __iter__(self) -> Iterator[str]:
        return iter(_WHERE)

    def __len__(self) -> int:
        return len(_WHERE)


REGISTRY: Mapping[str, type[Strategy]] = _Registry()

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
