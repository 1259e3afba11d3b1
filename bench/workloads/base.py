"""The workload contract: a model, its data and its loss, with nothing about parallelism.

Every strategy runs the same workload: the same model (built from the seed), the same global batch
at every step (derived from the seed and the step number) and the same loss. A user's own workload
enters as ``package.module:factory``; the factory returns a :class:`Workload`.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

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
    # How to give parameters their values after the model was built on the meta device and placed
    # with ``to_empty``: ``init(model)`` sets every parameter and buffer of ``model`` that is off
    # the meta device to the value ``build`` gives it, whatever its sharding (a DTensor's local shard
    # takes its part of the full value). With it, a sharding strategy builds the model on the meta device,
    # shards it, and allocates only this rank's part: a model larger than one device fits. None:
    # every strategy builds the whole model on the device first.
    init: Callable[[nn.Module], None] | None = None
    # How this model is tensor-parallel: ``tp_plan(model, mesh, **options)`` parallelizes the model
    # in place (torchtitan keeps each model's parallelize function with the model, since the plan
    # depends on its module names). None: the tensor-parallel strategies skip this workload.
    tp_plan: Callable[..., None] | None = None
    # The relative tolerance of this workload's parity check against one device, when its own
    # rounding needs another than the default (by precision and optimizer, bench.results.derived):
    # a model whose losses drift apart by float rounding faster than most. --parity-tol overrides it.
    parity_tol: float | None = None

    def facts(self, spec: str, dims: dict[str, int]) -> WorkloadFacts:
        """What the planner records of this workload, once: counted on the meta device, without
        allocating (a model that cannot build there keeps no count)."""
        params, train_bytes, trainable_bytes, batch_norm = self.params, None, None, None
        try:
            model = self.build(torch.device("meta"))
            built = list(model.parameters())
            norms = sorted({type(m).__name__ for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)
                            and not isinstance(m, nn.SyncBatchNorm)})
            batch_norm = ", ".join(norms) or None
            params = params if params is not None else sum(p.numel() for p in built)
            train_bytes = sum(p.numel() * p.element_size() * (2 if p.requires_grad else 1) for p in built)
            trainable_bytes = sum(p.numel() * p.element_size() for p in built if p.requires_grad)
        except Exception:  # noqa: BLE001 - a model that cannot build on meta keeps no count
            pass
        shapes, boundary, tp_dims = self.layout_facts()
        return WorkloadFacts(name=self.name, spec=spec, dims=dict(dims), global_batch=self.global_batch,
                             flops_per_sample=self.flops_per_sample, params=params, n_blocks=self.n_blocks,
                             n_heads=self.n_heads, has_tp_plan=self.tp_plan is not None,
                             description=self.description, train_bytes=train_bytes, trainable_bytes=trainable_bytes,
                             parity_tol=self.parity_tol, batch_norm=batch_norm, param_shapes=shapes,
                             boundary_bytes=boundary, tp_dims=tp_dims)

    def layout_facts(self) -> tuple[tuple[tuple[int, ...], ...] | None, tuple[int, ...] | None,
                                    dict[str, tuple[int, ...]] | None]:
        """The model's layout as :class:`WorkloadFacts` records it for the strategies' memory terms
        (strategies.memory), each None where the model cannot be built, run or tensor-parallelized
        on the meta device: ``param_shapes``, each distinct parameter in ``model.parameters()`` order
        (:func:`param_shapes`); ``boundary_bytes``, one sample's output of each block
        (:func:`boundary_bytes`); ``tp_dims``, per tensor-parallel plan the dimension it shards each
        parameter along, in the same order (:func:`tp_dims`)."""
        try:
            model = self.build(torch.device("meta"))
            shapes = param_shapes(model, self.blocks(model))
        except Exception:  # noqa: BLE001 - a model that cannot build on meta keeps no layout
            return None, None, None
        return shapes, boundary_bytes(self, model), tp_dims(self)


#: The tensor-parallel plans a workload's ``tp_plan`` is asked for (the tensor strategies' option
#: ``tp_plan``): their shardings are recorded in :attr:`WorkloadFacts.tp_dims`.
TP_PLANS = ("megatron", "sp")


def param_shapes(model: nn.Module, blocks: list[nn.Module]) -> tuple[tuple[int, ...], ...]:
    """Each distinct parameter of ``model`` in order: (index of the first of ``blocks`` that holds
    it, -1 for none; bytes per element; 1 if it trains else 0; its shape)."""
    where: dict[int, int] = {}
    for k, b in enumerate(blocks):
        for p in b.parameters():
            where.setdefault(id(p), k)
    return tuple((where.get(id(p), -1), p.element_size(), int(p.requires_grad), *p.shape)
                 for p in model.parameters())


def boundary_bytes(wl: Workload, model: nn.Module) -> tuple[int, ...] | None:
    """Bytes of each block's output for one sample: the blocks run in sequence on the meta device
    on a one-sample input shaped like the workload's batch (None when a block cannot run there)."""
    try:
        x = wl.batch(0)[0][:1].to("meta")
        out = []
        with torch.no_grad():
            for block in wl.blocks(model):
                x = block(x)
                out.append(x.numel() * x.element_size())
        return tuple(out)
    except Exception:  # noqa: BLE001 - a block that cannot run on meta: no boundary sizes
        return None


def tp_dims(wl: Workload) -> dict[str, tuple[int, ...]] | None:
    """For each plan of :data:`TP_PLANS` the workload's ``tp_plan`` accepts: the dimension it
    shards each parameter along (-1: replicated). The plan is applied to a model on the meta device
    over a two-rank mesh of a fake process group (torch.testing's FakeProcessGroup: collectives do
    nothing), so the placements are the plan's own, whatever its module names. None without a
    plan, inside a process group (a rank never needs it) or when the plan cannot run there."""
    import torch.distributed as dist

    if wl.tp_plan is None or not dist.is_available() or dist.is_initialized():
        return None
    try:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import DTensor
        from torch.testing._internal.distributed.fake_pg import FakeStore
    except Exception:  # noqa: BLE001 - a torch build without it: no tensor-parallel layout
        return None
    out: dict[str, tuple[int, ...]] = {}
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    try:
        mesh = init_device_mesh("cpu", (2,))
        for plan in TP_PLANS:
            try:
                model = wl.build(torch.device("meta"))
                wl.tp_plan(model, mesh, plan=plan)
            except Exception:  # noqa: BLE001 - a plan this workload does not offer
                continue
            out[plan] = tuple(next((pl.dim for pl in p.placements if pl.is_shard()), -1)
                              if isinstance(p, DTensor) else -1 for p in model.parameters())
    finally:
        dist.destroy_process_group()
    return out or None


def seeded(seed: int, step: int) -> torch.Generator:
    """A CPU generator for the data of ``step``: same seed and step, same numbers, on every rank."""
    g = torch.Generator()
    g.manual_seed(seed * 1_000_003 + step)
    return g


def init_by_name(model: nn.Module, seed: int, *, std: Callable[[str], float],
                 vector: Callable[[str], float]) -> None:
    """Give every parameter of ``model`` off the meta device its value: a matrix (two dimensions or
    more) normal with ``std(name)``, a vector filled with ``vector(name)``. Each matrix draws from
    its own generator, seeded from ``seed`` and its name in the whole model, on the device it lives
    on: its value does not depend on how the model is cut or sharded, so a shard (a DTensor's local
    part) or a pipeline stage gets exactly its part of what one device would hold. (CUDA draws
    depend on the GPU model, whose size sets the generator's launch grid: ranks and the one-device
    reference agree on GPUs of one model, as on one machine.)"""
    from torch.distributed.tensor import DTensor, distribute_tensor

    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.device.type == "meta":
                continue
            local = p.to_local() if isinstance(p, DTensor) else p
            full = torch.empty(p.shape, dtype=local.dtype, device=local.device)
            if p.dim() >= 2:
                g = torch.Generator(device=local.device)
                g.manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
                full.normal_(0.0, std(name), generator=g)
            else:
                full.fill_(vector(name))
            if isinstance(p, DTensor):
                # Every rank holds the same full value: each keeps its part, nothing is sent.
                full = distribute_tensor(full, p.device_mesh, p.placements, src_data_rank=None).to_local()
            local.copy_(full)


def build_on(device: torch.device, seed: int, ctor: Callable[[], nn.Module]) -> nn.Module:
    """Construct ``ctor()`` with parameters initialised directly on ``device`` from ``seed``."""
    torch.manual_seed(seed)
    with torch.device(device):
        return ctor()


def batch_problem(wl: Workload, batch: object, step: int) -> str | None:
    """Why ``batch`` (what ``wl.batch(step)`` returned) is not a global batch of ``wl``, or None:
    it must be a tuple of tensors, each with ``wl.global_batch`` samples in its first dimension (a
    smaller batch would pass as faster, its samples/s counted on samples never trained)."""
    if not isinstance(batch, (tuple, list)) or not batch or not all(isinstance(t, Tensor) for t in batch):
        return f"batch({step}) returned {type(batch).__name__}, not a tuple of tensors (inputs, targets)"
    sizes = sorted({t.shape[0] if t.dim() else 0 for t in batch})
    if sizes != [wl.global_batch]:
        return (f"batch({step}) returned {' and '.join(map(str, sizes))} samples, but the workload's global batch is "
                f"{wl.global_batch}: return global_batch samples in the first dimension of every tensor")
    return None


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
