"""The typed contracts between planner, launcher and worker.

* :class:`CellSpec`: one training cell, planned once (workload facts resolved, options validated,
  devices chosen); the launcher serialises it, the worker reads exactly this.
* :class:`ServeCellSpec`: one serving cell (placement, policy, load level); :class:`CollectiveGroupSpec`:
  one collective sweep group (the torchrun of a backend and world size, its op/dtype/size ladder) and
  :class:`CollectivePointSpec`: one point of its sweep.
* :class:`CellKey`: what every mode's spec gives the one row start
  (:func:`bench.results.identity.start_row`): its mode and its identity columns.
* :class:`GroupPlan`: the cells one torchrun runs, with the group's backend and measurement settings.
* :class:`RankMeasurement`: what one rank measured in one cell.
* Events (:class:`Start`, :class:`Error`, :class:`Measured`): the worker-to-launcher stream, one
  JSON line each.
* :data:`Status` and :func:`outcome`: the one status vocabulary (ok, failed, timeout, skipped, with
  a reason) of the rows of every :data:`Mode` (train, serve, collective).

Everything crosses the process boundary as JSON written by :func:`dump` and read back by
:func:`load`, which checks every field's presence and type: a plan or event that does not match
the contract fails loudly at the boundary instead of as a KeyError deep in a rank.
"""

from __future__ import annotations

import dataclasses
import json
import typing
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from bench.core.contract import ContractError, build
from bench.core.knobs import Training
from bench.core.memory import Footprint

#: The status of a row of any mode (a training cell, a serving cell, a collective's sweep point),
#: with a reason whenever it is not ``ok``.
Status = Literal["ok", "failed", "timeout", "skipped"]
STATUSES: tuple[str, ...] = typing.get_args(Status)
#: What a cell measures: a training step, a served request stream, or a collective's sweep.
Mode = Literal["train", "serve", "collective"]
MODES: tuple[str, ...] = typing.get_args(Mode)


def outcome(status: str, reason: str | None = None) -> dict[str, Any]:
    """The ``status`` and ``reason`` columns of a row of any mode. A status outside :data:`STATUSES`
    is a ContractError, so no mode writes a word the readers (summary, reports, compare) do not know."""
    if status not in STATUSES:
        raise ContractError(f"status {status!r} is not one of {', '.join(STATUSES)}")
    return {"status": status, "reason": reason}


#: The start of the skip reason of a multi-process strategy's one-rank cell under a second backend
#: (``bench.plan.matrix.plan`` runs it under one); ``bench.gate.compare`` reads a baseline's ok row of such a
#: cell as a change of the matrix, not a breakage
ONE_RANK_SKIP = "one rank has no one to talk to"


class CellKey(Protocol):
    """A planned cell of any mode, as its row sees it: the mode and the identity columns every row
    of the cell starts with (:func:`bench.results.identity.start_row`)."""

    @property
    def mode(self) -> Mode: ...

    def identity(self) -> dict[str, Any]: ...


@dataclass(frozen=True, kw_only=True)
class WorkloadFacts:
    """What the planner learned from a workload once; ranks rebuild the model from ``spec``/``dims``."""
    name: str  # display name, dimensions included: gpt-small(d_model=512)
    spec: str  # built-in name or package.module:factory
    dims: dict[str, int]
    global_batch: int
    flops_per_sample: float | None
    params: int | None
    n_blocks: int
    n_heads: int | None
    has_tp_plan: bool
    description: str
    # Bytes of the parameters and their gradients (a frozen parameter counts once), as the model builds them
    train_bytes: int | None = None  # None: the model cannot be built on the meta device
    trainable_bytes: int | None = None  # the trainable ones alone: Adam and AdamW keep two values each
    parity_tol: float | None = None  # its cells' parity tolerance (its own, or --parity-tol); None: the default
    batch_norm: str | None = None  # BatchNorm classes held ("BatchNorm2d"): a rank normalises over its share
    sample_bytes: int | None = None  # bytes of one sample of the batch (inputs and targets); None: unknown
    # The model's layout the strategies' memory terms read (bench.workloads.base.Workload.layout_facts)
    param_shapes: tuple[tuple[int, ...], ...] | None = None
    boundary_bytes: tuple[int, ...] | None = None
    tp_dims: dict[str, tuple[int, ...]] | None = None


#: Most distinct global batches a cell stages on its device.
BATCH_POOL = 64


@dataclass(frozen=True, kw_only=True)
class Measure:
    """How a cell is measured (the same for every cell of a run today)."""

    steps: int  # timed steps, at least
    warmup: int  # warm-up steps, at least
    profile_steps: int
    precision: str  # fp32 | bf16
    seed: int
    repeats: int = 1  # times the cell is measured, in rounds over the group's cells
    warmup_max: int = 0  # warm-up continues until the step time settles, up to this many steps (0: fixed)
    settle: float = 0.01  # settled: the median of the last 5 warm-up steps moved less than this
    steps_max: int = 0  # timed steps continue until the median's interval is narrow enough, up to this (0: fixed)
    target_ci: float = 0.02  # narrow enough: relative half-width of the median's 95% interval
    time_cap_s: float = 0.0  # no more timed steps are added past this many seconds (0: no cap)
    # When the profiled steps run: "inline" after the cell's first timed repeat (in the processes that
    # go on to time the group's later cells), or "end": after every timed step of the group, in a
    # profile pass that builds the cell again (bench.train.profile.profile_cell), so no timed step ever
    # follows a GPU profiler session in its process. The first repeat then profiles one step on the
    # CPU side only, for the distribution check's communication evidence.
    profile_at: str = "inline"

    def staged_batches(self) -> int:
        """Global batches a cell stages on its device before timing (step s trains batch s % this)."""
        return min(max(self.warmup, self.warmup_max) + max(self.steps, self.steps_max), BATCH_POOL)


@dataclass(frozen=True, kw_only=True)
class CellSpec:
    cell_id: int
    workload: WorkloadFacts
    strategy: str  # registry name
    strategy_spec: str  # what loads it: a registry name or package.module:Class
    backend: str  # the process-group backend the cell runs under
    device: str  # cpu | cuda
    n_devices: int  # devices the cell uses (the world size column)
    n_procs: int  # processes it runs in (1 for DataParallel and layer split)
    devices: tuple[int, ...]  # planned CUDA indices on each node (local rank r drives devices[r]); empty on CPU
    options: dict[str, Any]  # the strategy's declared options, validated, defaults filled in
    labels: dict[str, Any]  # the strategy's settings as row columns (mesh, schedule, ...)
    role: str  # reference | independent | ""
    measure: Measure
    scaling: Literal["strong", "weak"] = "strong"
    mode: Mode = "train"
    nnodes: int = 1  # nodes (torchrun agents) its processes are spread over, n_procs / nnodes on each
    training: Training = Training()  # how it trains: optimizer, compile, activation checkpointing, lr
    # the precision policy the strategy trains under (Strategy.precision_policy): parameter, compute
    # and reduction dtypes; a cell's speed-up is read against a one-device cell of the same policy
    precision_policy: str = ""
    # The memory model's prediction for the cell's fullest device (bench.plan.memory), when the
    # workload's facts allow one
    memory: Footprint | None = None
    # a reference whose parity a multi-device cell of the plan reads: it measures its own rounding
    # (bench.train.rounding), which sets their tolerance; a reference nothing compares with does not
    compared: bool = True

    @property
    def procs_per_node(self) -> int:
        return self.n_procs // self.nnodes

    @property
    def title(self) -> str:
        knobs = self.training.short()
        return f"{self.strategy} {self.workload.name} {self.backend} x{self.n_devices}" + (f" {knobs}" if knobs else "")

    def identity(self) -> dict[str, Any]:
        return cell_identity(self.cell_id, self.mode, self.workload.name, self.strategy, self.backend,
                             self.device, self.n_devices)


def cell_identity(cell_id: int, mode: Mode, workload: str, strategy: str, backend: str, device: str,
                  world_size: int) -> dict[str, Any]:
    """The identity columns of a training or serving cell's row (``strategy`` is a training
    strategy or a serving placement, ``backend`` what carries its traffic)."""
    return {"cell_id": cell_id, "mode": mode, "workload": workload, "strategy": strategy, "backend": backend,
            "device": device, "world_size": world_size}


@dataclass(frozen=True, kw_only=True)
class ServeCellSpec:
    """One serving cell: a (policy, load level) served by a pool of one placement and world size."""

    cell_id: int
    workload: str  # display name, dimensions included
    strategy: str  # the placement: replicas | dataparallel-infer | pinned-tenants | pipeline
    policy: str  # balancing policy (replicas), pinned (pinned-tenants) or '-'
    load: str  # the load level's label: poisson@50/s, closed@4, ...
    scenario: str  # levels | sweep | noisy-alone | noisy-flood
    task: str  # score | generate | classify
    offered_rps: float | None  # scheduled arrivals per second (None: a closed loop)
    batch_max: int  # most requests in a batch (1 without dynamic batching)
    batch_wait_s: float  # longest wait for a fuller batch
    slo_s: float | None  # latency target of the rate sweep
    backend: str = "mp-queue"  # what carries the requests to the processes
    device: str  # cpu | cuda
    world_size: int  # devices the pool serves on
    precision: str  # fp32 | bf16
    params: int | None
    role: str = "independent"
    mode: Literal["serve"] = "serve"

    def identity(self) -> dict[str, Any]:
        return cell_identity(self.cell_id, self.mode, self.workload, self.strategy, self.backend, self.device,
                             self.world_size)


@dataclass(frozen=True, kw_only=True)
class CollectiveGroupSpec:
    """One group of the collective sweep: a torchrun of ``world_size`` ranks under ``backend`` that
    times every (op, dtype, size) of its ladder; the sweep writes it as the group's plan file and its
    ranks read exactly this."""

    backend: str
    device: str  # cpu | cuda
    world_size: int
    ops: tuple[str, ...]
    dtypes: tuple[str, ...]  # fp32 | bf16 | ...
    sizes: tuple[int, ...]  # bytes, ascending
    iters: int
    warmup: int
    budget_s: float  # timed calls continue until this many seconds, up to max_iters
    max_iters: int
    graph_max_bytes: int  # sizes up to this are replayed from a CUDA graph (stream-ordered backends)
    reference: bool  # also time the plain all_reduce loop at the largest size
    pg_timeout_s: float
    out: str  # where rank 0 writes the group's rows (JSON)
    mode: Literal["collective"] = "collective"

    def identity(self) -> dict[str, Any]:
        return {"backend": self.backend, "device": self.device, "world_size": self.world_size}

    def point(self, kind: Literal["sweep", "reference"], op: str, dtype: str, nbytes: int) -> CollectivePointSpec:
        return CollectivePointSpec(backend=self.backend, device=self.device, world_size=self.world_size,
                                   kind=kind, op=op, dtype=dtype, bytes=nbytes)


@dataclass(frozen=True, kw_only=True)
class CollectivePointSpec:
    """One point of a collective sweep: an op at one dtype and size in one group."""

    backend: str
    device: str
    world_size: int
    kind: Literal["sweep", "reference"]  # the sweep's op, or the plain loop it must match
    op: str
    dtype: str
    bytes: int  # the size S of nccl-tests' definitions
    mode: Literal["collective"] = "collective"

    def identity(self) -> dict[str, Any]:
        return {"backend": self.backend, "device": self.device, "world_size": self.world_size, "kind": self.kind,
                "op": self.op, "dtype": self.dtype, "bytes": self.bytes}


@dataclass(frozen=True, kw_only=True)
class GroupPlan:
    """One torchrun: ``n_procs`` processes, one process group, these cells in order."""

    backend: str
    device: str
    n_procs: int
    events_prefix: str
    pg_timeout_s: float
    trace_dir: str | None
    cells: tuple[CellSpec, ...]
    # cell id -> its earlier repeats' steps (the slowest rank's), one list a repeat: its timed median
    # includes them, and its repeats here are numbered on from them (a relaunch, a cell measured again)
    earlier: dict[str, list[list[float]]] = field(default_factory=dict)
    # cell id -> the warm-up steps its first repeat took to settle: its profile pass warms up as long
    settled: dict[str, int] = field(default_factory=dict)
    # cell id -> the profiled step its breakdown already has (a cell measured again): its profile
    # pass runs only when the timed median moves further than BREAKDOWN_GAP_MAX from it
    held: dict[str, float] = field(default_factory=dict)
    deadline_unix: float | None = None  # no new round starts after this (the run's time budget)

    def first_repeat(self, cell_id: int) -> int:
        """The index of ``cell_id``'s first repeat in this launch (its earlier repeats counted)."""
        return len(self.earlier.get(str(cell_id), ()))


@dataclass(kw_only=True)
class RankMeasurement:
    """One rank's measurements of one cell (never raises out of a rank: failures are a status)."""

    rank: int
    status: Literal["ok", "failed"] = "ok"
    reason: str = ""
    times: list[float] = field(default_factory=list)  # timed steps, seconds
    starts: list[float] = field(default_factory=list)  # unix start of each timed step
    losses: list[float] = field(default_factory=list)  # warm-up then timed, NaN where none
    loss_weight: float = 0.0
    peak_mem: float | None = None
    energy_j: float | None = None  # NVML energy of this rank's GPUs over the timed window
    window: tuple[float, float] | None = None  # unix start and end of the timed steps
    breakdown: dict[str, float] = field(default_factory=dict)
    comm: list[dict[str, Any]] = field(default_factory=list)
    profile_s: float = 0.0
    metrics: dict[str, Any] = field(default_factory=dict)  # the strategy's own values
    self_parity: float | None = None  # relative error a strategy measured against its own reference
    parity_rounding: float | None = None  # a reference's loss difference on reversed batches (bench.train.rounding)
    gpu_name: str | None = None
    # Evidence for the distribution check: parameter elements this rank holds (a shard counts its
    # local part), communication per step, devices of this rank holding memory.
    param_numel: int | None = None
    comm_calls_per_step: float | None = None
    comm_bytes_per_step: float | None = None
    devices_used: int | None = None
    warmup_steps: int = 0  # warm-up steps taken (the adaptive warm-up may take more than asked)
    compile_s: float | None = None  # the first warm-up step's seconds beyond a settled one (compile on)
    compiled_graphs: int | None = None  # graphs torch.compile built for the cell (compile on), graph breaks
    graph_breaks: int | None = None
    timed_graphs: int | None = None  # graphs torch.compile built during the timed steps: recompiles
    recompile_limit: bool = False  # dynamo hit its recompile limit: that code ran eager from then on
    checkpointed: int | None = None  # forwards run under activation checkpointing (ac on), rank's own
    # Memory: the allocator's reserved peak over the timed steps, what NVML saw the process use after
    # them, and the bytes of parameters, gradients (at the first optimizer step) and optimizer state
    # (after it) this rank holds, counted from its optimizer's tensors (a DTensor counts its shard)
    peak_reserved: float | None = None
    nvml_process: float | None = None
    held_params: float | None = None
    held_grads: float | None = None
    held_state: float | None = None
    target_reached: bool | None = None  # the timed steps reached the interval target (None: not asked)
    # Where this rank ran (bench.multinode.netinfo.placement): its node (launcher --node-rank), host
    # name, the address and interface its traffic to other nodes takes, local rank and devices.
    node_rank: int = 0
    host: str = ""
    addr: str = ""
    iface: str = ""
    local_rank: int = 0
    device_ids: list[str] = field(default_factory=list)
    threads: int | None = None  # the rank's intra-op CPU threads (torch.get_num_threads: OMP_NUM_THREADS)


@dataclass(frozen=True, kw_only=True)
class Start:
    cell_id: int
    t: float
    repeat: int = 0
    event: Literal["start"] = "start"


@dataclass(frozen=True, kw_only=True)
class Error:
    cell_id: int
    rank: int
    reason: str
    t: float
    event: Literal["error"] = "error"


@dataclass(frozen=True, kw_only=True)
class Measured:
    cell_id: int
    wall_s: float
    ranks: list[RankMeasurement]
    t: float
    repeat: int = 0
    event: Literal["measured"] = "measured"


@dataclass(frozen=True, kw_only=True)
class Profiled:
    """A cell's deferred profile pass (``Measure.profile_at == "end"``): each rank's breakdown and
    communication records, to be merged into the cell's first repeat."""

    cell_id: int
    wall_s: float
    ranks: list[RankMeasurement]
    t: float
    event: Literal["profiled"] = "profiled"


#: The ``repeat`` of a :class:`Start` that opens a cell's profile pass rather than a timed repeat.
PROFILE_PASS = -1
#: The ``repeat`` of a :class:`Start` that opens a reference's rounding probe (bench.train.rounding),
#: after its first timed repeat.
ROUNDING_PASS = -2


def deferred(cell: CellSpec) -> bool:
    """The cell's profiled steps run in its group's profile pass, after every timed step."""
    return cell.measure.profile_at == "end" and cell.measure.profile_steps > 0


@dataclass(frozen=True, kw_only=True)
class Stopped:
    """The worker ends its rounds early (the time budget's deadline passed)."""

    reason: str
    t: float
    rounds_done: int
    event: Literal["stopped"] = "stopped"


Event = Start | Error | Measured | Profiled | Stopped
EVENTS: dict[str, type] = {"start": Start, "error": Error, "measured": Measured, "profiled": Profiled,
                           "stopped": Stopped}


#: Growth of a device's allocated tensor bytes that makes it used by a one-process cell (devices_grown).
DEVICE_USED_BYTES = 2**16


def devices_grown(peaks: list[int], before: list[int]) -> int:
    """How many of a one-process cell's devices its training grew: the peak of allocated tensor
    bytes during the timed steps above what the device held before the cell was built. Allocated
    bytes count tensors only (no CUDA context, no allocator cache), so any parameter, gradient or
    activation the cell keeps on a device counts; a device the cell never touched stays at 0. The
    floor is 64 KiB: a layer split moves its labels to its last GPU (2 KiB for 256 int64 labels), which
    alone must not make a GPU used. (A 1 MiB floor failed a layer split of the built-in convnet on 2
    and 4 H100s: its last stage, a 2048 x 10 classifier, holds about 0.7 MB with its gradients and
    inputs.)"""
    return sum(p - b >= DEVICE_USED_BYTES for p, b in zip(peaks, before))


def _scalar(v: Any) -> Any:
    """numpy and 0-d tensor scalars as Python numbers (a strategy's finish() may return them);
    anything else is refused rather than turned into a string that breaks a typed column later."""
    if type(v).__module__ == "numpy" and hasattr(v, "item"):
        return v.item()
    if hasattr(v, "dim") and hasattr(v, "item") and v.dim() == 0:
        return v.item()
    raise TypeError(f"{type(v).__name__} {v!r} is not a JSON value; return plain numbers and strings")


def dump(obj: Any) -> str:
    """JSON of a contract dataclass (tuples become lists; NaN stays NaN, as JSON allows in Python)."""
    return json.dumps(dataclasses.asdict(obj), default=_scalar)


def load(cls: type, text: str | dict) -> Any:
    """Parse and validate ``text`` as ``cls``; raises :class:`ContractError` naming the field."""
    data = json.loads(text) if isinstance(text, str) else text
    return build(cls, data, cls.__name__)


def load_event(line: str) -> Event:
    data = json.loads(line)
    kind = data.get("event") if isinstance(data, dict) else None
    if kind not in EVENTS:
        raise ContractError(f"event {kind!r} unknown; expected one of {', '.join(EVENTS)}")
    return build(EVENTS[kind], data, kind)
