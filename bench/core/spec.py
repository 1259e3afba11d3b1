"""The typed contracts between planner, launcher and worker.

* :class:`CellSpec`: one cell, planned once (workload facts resolved, options validated, devices
  chosen); the launcher serialises it, the worker reads exactly this.
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
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Literal, Union

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


@dataclass(frozen=True, kw_only=True)
class Measure:
    """How a cell is measured (the same for every cell of a run today)."""

    steps: int  # timed steps, at least
    warmup: int  # warm-up steps, at least
    profile_steps: int
    precision: str  # fp32 | bf16
    seed: int
    lr: float
    repeats: int = 1  # times the cell is measured, in rounds over the group's cells
    warmup_max: int = 0  # warm-up continues until the step time settles, up to this many steps (0: fixed)
    settle: float = 0.01  # settled: the median of the last 5 warm-up steps moved less than this
    steps_max: int = 0  # timed steps continue until the median's interval is narrow enough, up to this (0: fixed)
    target_ci: float = 0.02  # narrow enough: relative half-width of the median's 95% interval
    time_cap_s: float = 0.0  # no more timed steps are added past this many seconds (0: no cap)
    # When the profiled steps run: "inline" after the cell's first timed repeat (in the processes that
    # go on to time the group's later cells), or "end": after every timed step of the group, in a
    # profile pass that builds the cell again (bench.train.worker.profile_cell), so no timed step ever
    # follows a GPU profiler session in its process. The first repeat then profiles one step on the
    # CPU side only, for the distribution check's communication evidence.
    profile_at: str = "inline"


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

    @property
    def procs_per_node(self) -> int:
        return self.n_procs // self.nnodes

    @property
    def title(self) -> str:
        return f"{self.strategy} {self.workload.name} {self.backend} x{self.n_devices}"


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
    first_repeat: dict[str, int] = field(default_factory=dict)  # cell id -> repeat index to start at (relaunch)
    deadline_unix: float | None = None  # no new round starts after this (the run's time budget)


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
    gpu_name: str | None = None
    # Evidence for the distribution check: parameter elements this rank holds (a shard counts its
    # local part), communication per step, devices of this rank holding memory.
    param_numel: int | None = None
    comm_calls_per_step: float | None = None
    comm_bytes_per_step: float | None = None
    devices_used: int | None = None
    warmup_steps: int = 0  # warm-up steps taken (the adaptive warm-up may take more than asked)
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


class ContractError(ValueError):
    """A plan or event that does not match its dataclass."""


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
    return _build(cls, data, cls.__name__)


def load_event(line: str) -> Event:
    data = json.loads(line)
    kind = data.get("event") if isinstance(data, dict) else None
    if kind not in EVENTS:
        raise ContractError(f"event {kind!r} unknown; expected one of {', '.join(EVENTS)}")
    return _build(EVENTS[kind], data, kind)


def _build(tp: Any, value: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ContractError(f"{where}: expected an object, got {type(value).__name__}")
        hints = typing.get_type_hints(tp)
        fields = {f.name: f for f in dataclasses.fields(tp)}
        unknown = set(value) - set(fields)
        if unknown:
            raise ContractError(f"{where}: unknown field(s) {sorted(unknown)}")
        kw = {}
        for name, f in fields.items():
            if name not in value:
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                    raise ContractError(f"{where}: missing field {name!r}")
                continue
            kw[name] = _build(hints[name], value[name], f"{where}.{name}")
        return tp(**kw)
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _build(a, value, where)
            except ContractError as e:
                errors.append(str(e))
        raise ContractError(errors[0] if errors else f"{where}: None not allowed")
    if origin is Literal:
        if value not in args:
            raise ContractError(f"{where}: {value!r} not one of {args}")
        return value
    if origin in (list, tuple):
        if not isinstance(value, list | tuple):
            raise ContractError(f"{where}: expected a list, got {type(value).__name__}")
        if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
            return tuple(_build(args[0], v, f"{where}[{i}]") for i, v in enumerate(value))
        if origin is tuple:
            if len(value) != len(args):
                raise ContractError(f"{where}: expected {len(args)} items, got {len(value)}")
            return tuple(_build(a, v, f"{where}[{i}]") for i, (a, v) in enumerate(zip(args, value)))
        return [_build(args[0], v, f"{where}[{i}]") for i, v in enumerate(value)] if args else list(value)
    if origin is dict:
        if not isinstance(value, dict):
            raise ContractError(f"{where}: expected an object, got {type(value).__name__}")
        vt = args[1] if args else Any
        return {str(k): _build(vt, v, f"{where}.{k}") for k, v in value.items()}
    if tp is Any:
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ContractError(f"{where}: expected a number, got {value!r}")
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ContractError(f"{where}: expected an integer, got {value!r}")
        return value
    if tp in (str, bool):
        if not isinstance(value, tp):
            raise ContractError(f"{where}: expected {tp.__name__}, got {value!r}")
        return value
    raise ContractError(f"{where}: cannot check type {tp!r}")
