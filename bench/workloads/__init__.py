"""Workloads: a model, its data and its loss, with nothing about parallelism.

Every strategy runs the same workload: the same model (built from the seed), the same global batch
at every step (derived from the seed and the step number) and the same loss. A user's own workload
enters as ``package.module:factory``; the factory returns a :class:`Workload`.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from bench.core.errors import UserError

if TYPE_CHECKING:
    from bench.core.spec import WorkloadFacts

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
    # The model's blocks in order: submodules of the model that its forward calls one after another
    # (running them in sequence must equal the forward). Pipelines cut between them; FSDP shards
    # each; a parameter shared by two blocks (tied embedding and head) cannot be cut apart.
    blocks: Callable[[nn.Module], list[nn.Module]] = field(default=lambda m: list(m.children()))
    n_blocks: int = 1
    n_heads: int | None = None  # attention heads, for tensor-parallel divisibility
    params: int | None = None
    description: str = ""
    # How this model is tensor-parallel: ``tp_plan(model, mesh, **options)`` parallelizes the model
    # in place (torchtitan keeps each model's parallelize function with the model, since the plan
    # depends on its module names). None: the tensor-parallel strategies skip this workload.
    tp_plan: Callable[..., None] | None = None

    def facts(self, spec: str, dims: dict[str, int]) -> WorkloadFacts:
        """What the planner records of this workload, once."""
        from bench.core.spec import WorkloadFacts

        params = self.params
        if params is None:  # count them without allocating: build on the meta device
            try:
                params = sum(p.numel() for p in self.build(torch.device("meta")).parameters())
            except Exception:  # noqa: BLE001 - a model that cannot build on meta keeps no count
                params = None
        return WorkloadFacts(name=self.name, spec=spec, dims=dict(dims), global_batch=self.global_batch,
                             flops_per_sample=self.flops_per_sample, params=params, n_blocks=self.n_blocks,
                             n_heads=self.n_heads, has_tp_plan=self.tp_plan is not None,
                             description=self.description)


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


def display_name(base: str, dims: dict[str, int]) -> str:
    """``mlp`` with width=1024 -> ``mlp(width=1024)``: two variants of one workload never share a name."""
    return base if not dims else f"{base}({','.join(f'{k}={v}' for k, v in sorted(dims.items()))})"


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
        # every dimension of a built-in workload is a size or a count (mlp[width=0] and
        # gpt-tiny[n_layer=0] trained an empty or a layerless model and reported ok)
        small = [(k, v) for k, v in dims.items() if isinstance(v, int) and v < 1]
        if small:
            k, v = small[0]
            raise UserError(f"workload {spec!r}: {k}={v} must be >= 1 (a size or a count); drop it for the "
                            "workload's default")
        try:
            wl = reg[spec](**kw)
        except TypeError as e:
            raise UserError(f"workload {spec!r}: {e}; see `parbench list` for its dimensions") from None
        return _named(wl, spec, dims)
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
    unknown = [k for k in dims if not (takes_any or k in accepted)]
    if unknown:
        raise UserError(f"workload {spec!r} takes no dimension {unknown[0]!r}; its factory accepts "
                        f"{', '.join(k for k in accepted if k != 'seed') or 'none'}")
    try:
        wl = factory(**{k: v for k, v in kw.items() if takes_any or k in accepted})
    except Exception as e:  # noqa: BLE001 - a user's factory failing is the user's to fix
        raise UserError(f"workload {spec!r}: its factory raised {type(e).__name__}: {' '.join(str(e).split())}"
                        [:300]) from None
    if not isinstance(wl, Workload):
        raise UserError(f"workload {spec!r}: factory returned {type(wl).__name__}, "
                        "expected bench.workloads.Workload")
    gb = wl.global_batch
    if isinstance(gb, bool) or not isinstance(gb, int) or gb < 1:  # a batch of 0 ran "ok" with a NaN efficiency
        raise UserError(f"workload {spec!r}: its factory built global_batch={gb!r}; it must be an integer >= 1 "
                        "(the factory should take global_batch and use it)")
    return _named(wl, spec.rpartition(".")[2].replace(":", "."), dims)


def _named(wl: Workload, base: str, dims: dict[str, int]) -> Workload:
    """The workload under a name that carries its dimensions (unless its factory named them)."""
    if dims and "(" not in wl.name:
        return dataclasses.replace(wl, name=display_name(wl.name or base, dims))
    return wl
