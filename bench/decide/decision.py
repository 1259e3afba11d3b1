"""A decision as a value: what :func:`bench.decide.recommend.recommend` concludes for one workload,
backend, world size and way of training, with the evidence it rests on as data (the pairs it
judged, what blocks it, whether the model fits one device, what bounds the fastest step, why the
fastest leads, what to try next, what was left out). :mod:`reports.words` puts it into sentences;
:func:`decisions_to_json` and :func:`decisions_from_json` store and read it back.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from enum import Enum, StrEnum
from typing import Any

from bench.core import knobs

#: the version of :func:`decisions_to_json`'s layout
SCHEMA = 1


class Verdict(StrEnum):
    """How two cells compare (:func:`bench.decide.rules.judge_pair`): the first (``A``) or the second
    (``B``) is faster beyond the noise by more than EQUIVALENT, both run at the same speed, or the
    pair is open (the intervals overlap by more than that, or one is not from repeats)."""

    A = "a"
    B = "b"
    SAME = "same"
    OPEN = "open"


class DecisionKind(StrEnum):
    """What a decision points to: nothing (undecided), one device, the library default, a strategy
    faster than the library default, or the fastest where no library default ran."""

    UNDECIDED = "undecided"
    ONE_DEVICE = "one-device"
    LIBRARY = "library"
    FASTER = "faster"
    FASTEST = "fastest"


class Ground(StrEnum):
    """The rule a decision follows (:mod:`bench.decide.recommend`)."""

    BLOCKED = "blocked"  # a blocker stops it
    GROSS = "gross"  # one device, by a margin no noise explains
    SLOWER = "slower"  # one device: every candidate is slower
    SAME_AS_ONE = "same-as-one"  # one device: the fastest is within EQUIVALENT of it
    NOT_BEYOND_NOISE = "not-beyond-noise"  # one device: no candidate is faster beyond the noise
    ONLY = "only"  # the only candidate
    AHEAD = "ahead"  # the fastest is the library default (or no default ran)
    FASTER = "faster"  # the fastest beats the library default beyond the noise
    DEFAULT_STANDS = "default-stands"  # the fastest does not beat the library default beyond the noise
    FITS_NOWHERE = "fits-nowhere"  # no cell of the workload ran: each ran out of memory or was predicted to
    NONE_PASSED = "none-passed"  # cells ran, but none matched one device (parity failed or not checked)


class Against(StrEnum):
    """What the fastest candidate is weighed against in a pair."""

    ONE_DEVICE = "one-device"
    RIVAL = "rival"  # the library default, else the runner-up
    RUNNER_UP = "runner-up"


class BlockerKind(StrEnum):
    NOT_STABLE = "not-stable"  # marked unstable and measured in one run
    CONTENDED = "contended"  # measured on a contended host
    UNPHYSICAL = "unphysical"  # a scaling efficiency that is not physical


class BoundKind(StrEnum):
    """What bounds a cell's step (``value``: the share of the step, of the device, or the MFU)."""

    COMMUNICATION = "communication"
    BUBBLE = "bubble"
    MEMORY = "memory"
    LAUNCH = "launch"
    COMPUTE = "compute"
    OFF = "off"  # not known: the profiled step is off the timed one (``value``; ``moved``: rebuilt)
    NO_BREAKDOWN = "no-breakdown"  # not known: no breakdown (``note``: the profile's note)


class PartKind(StrEnum):
    """A part of two breakdowns that explains a lead (``winner`` and ``other``: its two values)."""

    PARAM_DTYPE = "param-dtype"  # the winner's parameters are bf16, the other's cast under autocast
    EXPOSED_COMM = "exposed-comm"
    COMPUTE = "compute"
    CALLS = "calls"
    BYTES = "bytes"
    IDLE = "idle"
    BUBBLE = "bubble"
    BREAKDOWN_OFF = "breakdown-off"  # the gaps of profiled to timed step (None: within the limit)
    NO_BREAKDOWN = "no-breakdown"  # profiling off
    NONE_DIFFERS = "none-differs"  # no part differs by EXPLAINS


class TipKind(StrEnum):
    """Something to try when nothing scales."""

    BACKEND = "backend"  # ``name``; ``value``: its speed-up at this world size, when it ran
    FEWER_DEVICES = "fewer-devices"  # ``size`` devices reach ``value``
    BIGGER_BATCH = "bigger-batch"  # ``value``: the samples per device now
    OVERLAP_OPTION = "overlap-option"  # the strategy's ``name`` option, now ``value``


class ExcludedKind(StrEnum):
    INDEPENDENT = "independent"  # trains independent models
    PARITY_FAILED = "parity-failed"  # ``detail``: how
    PARITY_UNCHECKED = "parity-unchecked"  # no single-device reference to check against
    OUT_OF_MEMORY = "out-of-memory"


@dataclass(frozen=True, kw_only=True)
class Pair:
    """Two cells judged: the fastest (``a``) against another (``b``)."""

    against: Against
    a: int | None  # cell ids
    b: int | None
    a_strategy: str
    b_strategy: str
    verdict: Verdict
    lead: float | None = None  # b's median step / a's - 1
    need: int | None = None  # about how many repeats a cell would close an open pair
    repeated: bool = False  # both intervals come from repeats
    apart: bool | None = None  # the step intervals do not overlap (None: not judged)


@dataclass(frozen=True, kw_only=True)
class Blocker:
    kind: BlockerKind
    strategy: str
    cell: int | None = None
    reference: bool = False  # the cell is the single-device reference
    detail: str | float | None = None  # the noise, the load, the run's scaling note or the efficiency


class OomKind(StrEnum):
    """How a cell ran out of memory."""

    PLANNED = "planned"  # skipped before it started: its predicted peak exceeds the device
    RAN_OUT = "ran-out"  # an allocation failed while it ran (CUDA's OutOfMemoryError, the CPU allocator's)
    KILLED = "killed"  # a rank was killed by SIGKILL (on Linux, what the kernel's out-of-memory killer sends)


class ChangeKind(StrEnum):
    """A change that would make a model fit, in the order of what it costs (the first costs nothing
    but communication; the last, devices)."""

    SHARD_OPTIMIZER = "shard-optimizer"  # the optimizer state cut over ``world_size`` devices (ddp-zero1)
    CHECKPOINT = "checkpoint"  # activation checkpointing (--ac full)
    SMALLER_BATCH = "smaller-batch"  # ``batch`` samples per device (the largest predicted to fit; 0: none)
    MORE_DEVICES = "more-devices"  # the model and its state cut over ``world_size`` devices (fsdp)


@dataclass(frozen=True, kw_only=True)
class Change:
    """A change to the cell nearest to fitting and its predicted allocated peak (``peak_bytes``; None
    where the run gives no number: checkpointing without a cell at --ac full, which states the
    ``activations`` share of the peak instead); ``fits``: that peak with the model's margin fits."""

    kind: ChangeKind
    strategy: str = ""
    world_size: int | None = None
    batch: int | None = None
    now: float | None = None  # the micro-batch per device now (a smaller batch)
    peak_bytes: float | None = None
    fits: bool | None = None
    activations: float | None = None  # share of the present peak that is activations
    cell: int | None = None  # the cell whose prediction it is (a cell of the run at --ac full)
    hosts: bool = False  # on CPU: the ranks' memory is their host's, so more devices means more hosts


@dataclass(frozen=True, kw_only=True)
class Fit:
    """Whether the model fits one device, and the memory of what the decision uses; for a model
    that fits nowhere in the matrix, the changes that would make it fit (cheapest first)."""

    fits_one_device: bool | None = None  # False: the single-device reference ran out of memory
    headroom: float | None = None  # free share of the device at the peak of what is used
    peak_bytes: float | None = None
    device_bytes: float | None = None
    reference: str = ""  # the strategy of the reference that ran out of memory
    parity_checked: bool = True
    predicted: bool = False  # peak_bytes is the memory model's prediction (nothing measured the peak)
    oom: OomKind | None = None  # how the reference ran out
    lower_bound: bool = False  # the prediction is a lower bound (activations not probed)
    nearest: str = ""  # fits nowhere: the cell nearest to fitting ('fsdp x2'), whose prediction peak_bytes is
    missed: bool = False  # fits nowhere: that cell was predicted to fit, and ran out while running
    changes: tuple[Change, ...] = ()


@dataclass(frozen=True, kw_only=True)
class Bound:
    kind: BoundKind
    value: float | None = None
    moved: float | None = None
    note: str = ""


@dataclass(frozen=True, kw_only=True)
class LeadReason:
    part: PartKind
    winner: float | None = None
    other: float | None = None


@dataclass(frozen=True, kw_only=True)
class Tip:
    kind: TipKind
    value: float | None = None
    name: str = ""
    size: int | None = None


@dataclass(frozen=True, kw_only=True)
class Excluded:
    strategy: str
    kind: ExcludedKind
    detail: str = ""


@dataclass(frozen=True, kw_only=True)
class Decision:
    """The decision for one workload, backend, world size and way of training."""

    workload: str
    backend: str
    world_size: int
    knobs: dict[str, str] = field(default_factory=dict)  # the group's training knobs
    training: dict[str, str] = field(default_factory=dict)  # those the run varies (the title names them)
    winner: str  # the fastest candidate
    runner_up: str | None = None
    step_ms: float  # the winner's median step
    speedup: float | None = None  # the winner's throughput against one device of the same workload
    candidates: int = 0
    kind: DecisionKind = DecisionKind.UNDECIDED
    ground: Ground = Ground.BLOCKED
    use: str | None = None  # the strategy to use (the reference's for one device); None: no decision
    resolved: bool = False  # every pair it rests on is closed, from repeats, and nothing blocks it
    pairs: tuple[Pair, ...] = ()
    blockers: tuple[Blocker, ...] = ()
    fit: Fit | None = None
    bounds: tuple[Bound, ...] = ()  # what bounds the winner's step
    noise: str | None = None  # why the winner is not stable (None: stable or not known)
    scaling_note: str | None = None  # the winner's scaling note
    reasons: tuple[LeadReason, ...] = ()  # why the winner leads the library default
    tips: tuple[Tip, ...] = ()
    excluded: tuple[Excluded, ...] = ()
    open_cells: tuple[int, ...] = ()  # cells an open decision needs measured again
    repeats_needed: int | None = None  # about how many repeats a cell would close it (None: not known)
    minutes_needed: float | None = None  # about how long those repeats take
    launch_bound: bool = False  # the workload's step measures launches more than the strategy
    nearest_parity: str | None = None  # none passed: the parity failure of the cell nearest to passing

    @property
    def title(self) -> str:
        """'gpt-tiny, gloo x2' (and the knobs the run varies: 'gpt-tiny, gloo x2, compile=on')."""
        return title_of(self.workload, self.backend, self.world_size, self.training)

    def pair(self, against: Against) -> Pair | None:
        return next((p for p in self.pairs if p.against == against), None)

    @property
    def margin(self) -> float | None:
        """The runner-up's step over the winner's, less one."""
        p = self.pair(Against.RUNNER_UP)
        return p.lead if p else None

    @property
    def significant(self) -> bool | None:
        """The winner is ahead of the runner-up beyond the noise (None: not judged)."""
        p = self.pair(Against.RUNNER_UP)
        return p.apart if p else None

    @property
    def same_speed(self) -> bool:
        p = self.pair(Against.RUNNER_UP)
        return p is not None and p.verdict == Verdict.SAME

    @property
    def fits_one_device(self) -> bool | None:
        return self.fit.fits_one_device if self.fit else None

    @property
    def headroom(self) -> float | None:
        return self.fit.headroom if self.fit else None

    def to_dict(self) -> dict:
        """Plain JSON values (enums as their strings, tuples as lists)."""
        return _plain(dataclasses.asdict(self))

    @classmethod
    def from_dict(cls, d: dict) -> Decision:
        return _build(cls, d)


def title_of(workload: str, backend: str, world_size: int, training: dict[str, str] | None = None) -> str:
    """A decision's title: workload, backend, world size and the knobs of ``training``."""
    tr = knobs.short(training, list(training)) if training else ""
    return f"{workload}, {backend} x{world_size}" + (f", {tr}" if tr else "")


def decisions_to_json(decisions: list[Decision]) -> dict:
    return {"schema": SCHEMA, "decisions": [d.to_dict() for d in decisions]}


def decisions_from_json(d: dict) -> list[Decision]:
    if d.get("schema") != SCHEMA:
        raise ValueError(f"decisions of schema {d.get('schema')!r}; this version reads schema {SCHEMA}")
    return [Decision.from_dict(x) for x in d.get("decisions", [])]


def _plain(v: Any) -> Any:
    if isinstance(v, Enum):
        return v.value
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if hasattr(v, "item") and not isinstance(v, (str, bytes)):  # a numpy scalar
        return v.item()
    return v


def _build(cls: type, d: dict) -> Any:
    """An instance of the dataclass ``cls`` from its :func:`_plain` dict."""
    hints = typing.get_type_hints(cls)
    kw = {}
    for f in dataclasses.fields(cls):
        if f.name in d:
            kw[f.name] = _typed(hints[f.name], d[f.name])
    return cls(**kw)


def _typed(hint: Any, v: Any) -> Any:
    if v is None:
        return None
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    origin = typing.get_origin(hint)
    if origin is tuple:
        return tuple(_typed(args[0], x) for x in v)
    if origin is dict:
        return dict(v)
    if args and origin is not None and not isinstance(v, (list, dict)) and all(
            not (isinstance(a, type) and (dataclasses.is_dataclass(a) or issubclass(a, Enum))) for a in args):
        return v  # a union of plain types (str | float)
    for a in args or [hint]:
        if isinstance(a, type) and issubclass(a, Enum):
            return a(v)
        if isinstance(a, type) and dataclasses.is_dataclass(a):
            return _build(a, v)
    return v
