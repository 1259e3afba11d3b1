"""The strategy protocol: what a strategy declares, what it sees inside a rank, what it hands back.

A strategy declares, as class attributes, its options (validated before anything launches), the
labels it puts on its rows (mesh, schedule, ...) and its own metrics (namespaced: they cannot
shadow a core column). At plan time ``check`` says whether a cell can run; inside each rank
``prepare`` builds the model the strategy's way and returns a :class:`Step`. The helpers that
several strategies share live in :mod:`strategies.common`.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

import torch
from torch import Tensor

from bench.core import backends
from bench.core.knobs import Training
from bench.core.memory import Terms
from bench.core.metrics import Metric, check_declared
from bench.core.spec import CellSpec
from bench.workloads import Batch, Workload
from strategies.catalog import MESH, Declaration, Option, option_column

__all__ = ["MESH", "Context", "OneProcessMultiGPU", "Option", "Step", "Strategy", "common_check", "option_column",
           "policy_text"]


@dataclass(frozen=True, kw_only=True)
class Context:
    """What a strategy sees inside a rank."""

    rank: int
    world_size: int  # processes in the group
    local_rank: int
    device: torch.device  # this process's (first) device
    devices: tuple[torch.device, ...]  # every device this process drives (one-process multi-GPU: several)
    backend: str
    seed: int
    precision: str  # "fp32" or "bf16"
    training: Training = Training()  # optimizer, compile, activation checkpointing, learning rate
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def lr(self) -> float:
        return self.training.lr

    @property
    def n_devices(self) -> int:
        """Devices the cell uses: processes x devices per process."""
        return self.world_size * len(self.devices)

    @property
    def p2p_via_host(self) -> bool:
        """Point-to-point must stage CUDA tensors through host memory on this backend."""
        return self.device.type == "cuda" and not backends.get(self.backend).p2p_on_cuda

    def autocast(self):
        """bf16 autocast when asked; a no-op otherwise."""
        if self.precision == "bf16":
            return torch.autocast(self.device.type, dtype=torch.bfloat16)
        return nullcontext()

    def to_device(self, batch: Batch) -> Batch:
        return tuple(t.to(self.device, non_blocking=True) for t in batch)  # type: ignore[return-value]


@dataclass(kw_only=True)
class Step:
    """One training step. ``run(global_batch)`` returns this rank's loss tensor, or None on a rank
    that sees no loss. The harness reports the global loss as sum over ranks of
    ``loss * loss_weight`` (1/W for data parallel, 1 on a pipeline's last stage, 0 elsewhere)."""

    run: Callable[[Batch], Tensor | None]
    loss_weight: float
    finish: Callable[[], dict[str, Any]] | None = None  # after the timed steps: the strategy's metrics
    # Strategies that train something other than the single-device model (an ensemble) check parity
    # against their own reference: the relative error, computed after the timed steps on rank 0.
    self_parity: Callable[[], float | None] | None = None
    # The optimizer over this rank's parameters: the distribution check reads how much of the model
    # the rank holds from it (a DTensor counts its local shard).
    optimizer: torch.optim.Optimizer | None = None


DECLARED_FIELDS = tuple(f.name for f in fields(Declaration))


class Strategy:
    """Base class: subclasses set the class attributes (a built-in takes them from its
    ``declared`` entry of :mod:`strategies.catalog`) and implement ``prepare``."""

    name: ClassVar[str]
    summary: ClassVar[str]
    needs: ClassVar[str]
    min_world: ClassVar[int] = 1
    one_process: ClassVar[bool] = False  # one process drives all the cell's devices
    role: ClassVar[str] = ""  # "reference" (single device) or "independent" (checks its own parity)
    options: ClassVar[tuple[Option, ...]] = ()
    labels: ClassVar[tuple[Metric, ...]] = ()  # row columns set at plan time from the options
    metrics: ClassVar[tuple[Metric, ...]] = ()  # row columns the strategy measures itself
    # What a cell on more than one device must show to count as distributed (bench.results.rows.distribution_check):
    # "comm" (communication bytes every step), "sharded" (each rank holds about 1/n of the
    # parameters), "split" (no rank holds the whole model), "devices" (every planned GPU holds
    # memory: one-process multi-GPU). A cell that does not show it fails with the reason.
    distributes: ClassVar[tuple[str, ...]] = ("comm",)
    # The model is cut into as many parts as devices (sharded, split by layers or tensors), never
    # held whole on one (min_share).
    cuts: ClassVar[bool] = False
    # How torch.compile applies under ``--compile on`` (strategies.training), for `parbench list`:
    # the whole module, each inner block (before sharding) or each pipeline stage; "" when the
    # strategy cannot compile, ``no_compile`` saying why (its compiled cells are skipped with it).
    compiles: ClassVar[str] = "the whole module"
    no_compile: ClassVar[str] = ""
    # Why activation checkpointing does not apply to the strategy ("" when it applies, per block).
    no_ac: ClassVar[str] = ""

    # What the decision layer reads (strategies.catalog.Declaration says what each means).
    default_for: ClassVar[str] = ""
    param_dtype_column: ClassVar[str] = ""
    overlap_option: ClassVar[str] = ""

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        declared = cls.__dict__.get("declared")
        if isinstance(declared, Declaration):  # a built-in: its declaration lives in strategies.catalog
            for f in DECLARED_FIELDS:
                setattr(cls, f, getattr(declared, f))
        check_declared(getattr(cls, "name", cls.__name__), cls.columns())

    @classmethod
    def columns(cls) -> tuple[Metric, ...]:
        """Every column this strategy adds to its rows: its labels, one ``option_<name>`` column per
        declared option (the value the cell ran with, default or given) and its metrics."""
        return (*cls.labels, *(option_column(o) for o in cls.options), *cls.metrics)

    def procs(self, n_devices: int) -> int:
        """Processes the cell needs."""
        return 1 if self.one_process else n_devices

    def resolve_options(self, n_devices: int, given: dict[str, Any]) -> dict[str, Any]:
        """The declared options, parsed, with defaults filled in (ValueError: the cell is skipped
        with that reason). ``given`` holds only options this strategy declares."""
        out = {}
        for opt in self.options:
            out[opt.name] = opt.parse(given[opt.name]) if opt.name in given else opt.default
        return out

    def check(self, cell: CellSpec, *, gpus: int) -> str | None:
        """None if the cell can run, else a one-line reason."""
        return common_check(cell, gpus=gpus, min_world=self.min_world)

    def min_share(self, cell: CellSpec) -> float:
        """The least share of the model's parameters that the fullest device of ``cell`` holds: 1
        for a strategy that keeps a whole copy on every device; 1/n for one that ``cuts`` the model
        into as many parts as devices. The planner skips a cell whose parameters cannot fit even so
        (bench.plan.memory)."""
        return 1 / cell.n_devices if self.cuts else 1.0

    def label_values(self, cell: CellSpec) -> dict[str, Any]:
        """Values of the declared labels for a runnable cell."""
        return {}

    def memory_terms(self, cell: CellSpec) -> Terms:
        """What this strategy holds on the fullest device of ``cell``, as terms of the memory model
        (bench.core.memory): the parameter share (:meth:`min_share`), the gradients' and the
        optimizer state's (:meth:`state_share`), and the data-parallel share of the global batch as
        the micro-batch of one forward. A strategy with buffers of its own, a micro-batch schedule
        or split activations says so by overriding this."""
        n = max(1, cell.n_devices)
        share = self.min_share(cell)
        return Terms(params=share, grads=share, state=self.state_share(cell),
                     micro_batch=-(-cell.workload.global_batch // n),
                     communicators=1 if cell.n_procs > 1 and cell.backend == "nccl" else 0)

    def state_share(self, cell: CellSpec) -> float:
        """The least share of the optimizer's state the fullest device holds: the parameters' share
        (:meth:`min_share`) unless the strategy shards the state alone (ZeRO-1)."""
        return self.min_share(cell)

    def knob_reason(self, cell: CellSpec) -> str | None:
        """Why the cell's training knobs cannot run under this strategy, or None."""
        t = cell.training
        if t.compile == "on" and not self.compiles:
            return f"compile=on: {self.no_compile}"
        if t.ac != "none" and self.no_ac:
            return f"ac={t.ac}: {self.no_ac}"
        return None

    def precision_policy(self, cell: CellSpec) -> str:
        """The dtypes the cell trains in: parameters, compute, gradient reduction (a column; speed-ups
        are read against a one-device cell of the same policy)."""
        return policy_text(cell.measure.precision, cast_params=False)

    def prepare(self, wl: Workload, ctx: Context) -> Step:
        raise NotImplementedError


def policy_text(precision: str, *, cast_params: bool) -> str:
    """'fp32'; 'fp32 params, bf16 autocast' (parameters and gradients fp32, matrix products in bf16);
    'bf16 params, fp32 reduce' (bf16 copies of the parameters compute, gradients reduced in fp32 into
    fp32 parameters: FSDP2's MixedPrecisionPolicy)."""
    if precision != "bf16":
        return "fp32"
    return "bf16 params, fp32 reduce" if cast_params else "fp32 params, bf16 autocast"


def common_check(cell: CellSpec, *, gpus: int, min_world: int = 1) -> str | None:
    """Checks every strategy shares: backend vs device, devices vs what is visible."""
    if cell.n_devices < min_world:
        return f"needs world size >= {min_world}, got {cell.n_devices}"
    reason = backends.get(cell.backend).unsupported(cell.device)
    if reason:
        return reason
    if cell.device == "cuda" and cell.nnodes > 1 and cell.n_devices // cell.nnodes > gpus:
        return (f"world size {cell.n_devices} over {cell.nnodes} nodes needs {cell.n_devices // cell.nnodes} GPUs a "
                f"node; {gpus} visible here")
    if cell.device == "cuda" and cell.n_devices > gpus * cell.nnodes:
        return f"world size {cell.n_devices} > {gpus} visible GPU(s)"
    return None


class OneProcessMultiGPU(Strategy):
    """Base of strategies that drive several GPUs from one process (DataParallel, layer split):
    CUDA only, one process, every planned device visible."""

    one_process = True
    distributes = ("devices",)
    cpu_reason: ClassVar[str] = "drives several GPUs from one process; on CPU there is one device"

    def check(self, cell: CellSpec, *, gpus: int) -> str | None:
        if cell.device != "cuda":
            return self.cpu_reason
        if cell.n_devices > gpus:
            return f"world size {cell.n_devices} > {gpus} visible GPU(s)"
        return None
