"""Workloads: a model, its data and its loss, with nothing about parallelism.

Every strategy runs the same workload: the same model (built from the seed), the same global batch
at every step (derived from the seed and the step number) and the same loss. A user's own workload
enters as ``package.module:factory``; the factory returns a :class:`Workload`.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from bench import UserError

Batch = tuple[Tensor, Tensor]


@dataclass(frozen=True, kw_only=True)
class Workload:
    """One model with its data.

    ``build(device)`` returns the model on ``device``, deterministic given ``seed`` and the device
    type. The model is an ``nn.Sequential`` (or ``blocks`` splits it into a sequence) so that
    pipeline-style strategies can cut it. ``batch(step)`` returns the *global* batch of that step on
    the CPU; strategies take their share of it.
    """

    name: str
    build: Callable[[torch.device], nn.Module]
    batch: Callable[[int], Batch]
    loss: Callable[[Tensor, Tensor], Tensor]
    global_batch: int
    flops_per_sample: float | None = None
    blocks: Callable[[nn.Module], list[nn.Module]] = field(default=lambda m: list(m.children()))
    n_blocks: int = 1
    n_heads: int | None = None  # attention heads, for tensor-parallel divisibility
    params: int | None = None
    description: str = ""


def seeded(seed: int, step: int) -> torch.Generator:
    """A CPU generator for the data of ``step``: same seed and step, same numbers, on every rank."""
    g = torch.Generator()
    g.manual_seed(seed * 1_000_003 + step)
    return g


def build_on(device: torch.device, seed: int, ctor: Callable[[], nn.Module]) -> nn.Module:
    """Construct ``ctor()`` with parameters initialised directly on ``device`` from ``seed``."""
    torch.manual_seed(seed)
    with torch.device(device):
        return ctor()


def shard(batch: Batch, rank: int, world: int) -> Batch:
    """This rank's contiguous share of a global batch (the batch must divide evenly)."""
    n = batch[0].shape[0]
    if n % world:
        raise ValueError(f"global batch {n} does not divide by {world} ranks")
    k = n // world
    return tuple(t[rank * k:(rank + 1) * k] for t in batch)  # type: ignore[return-value]


def _registry() -> dict[str, Callable[..., Workload]]:
    from bench.workloads import convnet, gpt, mlp

    reg: dict[str, Callable[..., Workload]] = {"mlp": mlp.make, "convnet": convnet.make}
    for size in gpt.SIZES:
        reg[size] = (lambda s: lambda **kw: gpt.make(size=s, **kw))(size)
    return reg


def names() -> list[str]:
    """Names of the built-in workloads."""
    return list(_registry())


def resolve(spec: str, *, seed: int = 0, global_batch: int | None = None, **dims: int) -> Workload:
    """Turn a workload spec into a :class:`Workload`.

    ``spec`` is a built-in name (``mlp``, ``gpt-tiny`` .. ``gpt-200m``, ``convnet``) or
    ``package.module:factory``; ``dims`` override dimensions (e.g. ``d_model=512`` for GPT).
    """
    reg = _registry()
    kw = dict(seed=seed, **dims)
    if global_batch is not None:
        kw["global_batch"] = global_batch
    if spec in reg:
        try:
            return reg[spec](**kw)
        except TypeError as e:
            raise UserError(f"workload {spec!r}: {e}; see `parbench list` for its dimensions") from None
    if ":" not in spec:
        raise UserError(
            f"unknown workload {spec!r}: use one of {', '.join(reg)} or 'package.module:factory'"
        )
    mod_name, _, attr = spec.partition(":")
    try:
        mod = importlib.import_module(mod_name)
    except Exception as e:  # noqa: BLE001 - any import failure is the user's to fix
        raise UserError(f"workload {spec!r}: cannot import {mod_name!r} ({type(e).__name__}: {e}); "
                        "check the module is on PYTHONPATH") from None
    factory = getattr(mod, attr, None)
    if not callable(factory):
        raise UserError(f"workload {spec!r}: {mod_name} has no callable {attr!r}")
    accepted = inspect.signature(factory).parameters
    takes_any = any(p.kind is p.VAR_KEYWORD for p in accepted.values())
    wl = factory(**{k: v for k, v in kw.items() if takes_any or k in accepted})
    if not isinstance(wl, Workload):
        raise UserError(f"workload {spec!r}: factory returned {type(wl).__name__}, "
                        "expected bench.workloads.Workload")
    return wl
