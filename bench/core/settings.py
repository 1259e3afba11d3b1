"""Every setting of a run, declared once, in typed sections (torchtitan's job-config style).

A setting is a field of one section's dataclass; its metadata holds the flag, the help, an example
and what it means. From that one declaration come the ``parbench run`` flag (grouped by section in
``--help``), the TOML key (flat, ``steps = 20``, or in its section's table, ``[measurement]
steps = 20``), the key in a run's ``meta.json`` (``config``, flat), the ``parbench list`` text and
the settings guide (``python -m tools.settings_page``). The training knobs (optimizer, compile,
activation checkpointing) are declared in :mod:`bench.core.knobs` and held here as the training
section's lists. The defaults are a machine's without a GPU where that matters; a machine with GPUs
overlays its own (:func:`bench.core.config.default_config`).

The module is torch-free: the CLI builds its flags from it before anything heavy is imported.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from typing import Any

from bench.core import knobs

_UNSET: Any = dataclasses.MISSING


def setting(default: Any = _UNSET, *, flag: str | None = None, kind: str = "str", help: str, example: str = "",
            key: str | None = None, choices: tuple[str, ...] = (), toml: bool = True) -> Any:
    """One setting's field. ``default``: a list or dict default is copied for each config; ``flag``:
    its ``parbench run`` flag (None: TOML only); ``kind``: how the flag reads its value (int, float,
    str, on: a switch that sets true, off: one that sets false, option: a repeatable KEY=VALUE);
    ``key``: its name in TOML and meta.json when not the field's; ``toml``: False for a value the run
    derives (never given)."""
    meta = {"setting": True, "flag": flag, "kind": kind, "help": help, "example": example, "key": key,
            "choices": choices, "toml": toml}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: copy.deepcopy(default), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(frozen=True, kw_only=True)
class MatrixSettings:
    """What runs: the workloads, strategies, backends and world sizes, and the data they share."""

    workloads: list[str] = setting(
        default=["mlp", "gpt-tiny", "convnet"], flag="--workloads",
        help="comma list: mlp, convnet, gpt-tiny..gpt-200m, name[dim=N,...], hf:llama[...] or package.module:factory",
        example="--workloads gpt-tiny,mlp")
    strategies: list[str] = setting(default=["all"], flag="--strategies", example="--strategies ddp,fsdp",
                                    help="comma list of strategies, or 'all' (default)")
    backends: list[str] = setting(default=["gloo"], flag="--backends",
                                  help="comma list: nccl, gloo (default: nccl and gloo with GPUs, gloo without)",
                                  example="--backends nccl")
    world_sizes: list[int] = setting(default=[1, 2], flag="--world-sizes",
                                     help="comma list of world sizes (default: 1,2 on CPU; 2, 4, 8 up to every GPU)",
                                     example="--world-sizes 1,2,4")
    device: str = setting("cpu", flag="--device", choices=("cpu", "cuda"),
                          help="cpu or cuda (default: cuda when GPUs are visible)", example="--device cpu")
    global_batch: int | None = setting(
        None, flag="--global-batch", kind="int", example="--global-batch 16",
        help="override every workload's global batch (the default matrix's model sized beyond one GPU then stays out)")
    scaling: str = setting("strong", flag="--scaling", choices=("strong", "weak"), example="--scaling weak",
                           help="strong (default: the same global batch at every world size) or weak (the same batch "
                                "per device: n devices train n x the global batch)")
    seed: int = setting(0, flag="--seed", kind="int", example="--seed 0",
                        help="seed of every model's initialisation and every batch (default 0)")
    precision: str = setting("auto", flag="--precision", choices=("auto", "fp32", "bf16"), example="--precision fp32",
                             help="auto (default: bf16 on cuda, fp32 on cpu), fp32 or bf16")
    options: dict[str, Any] = setting(
        default={}, flag="--option", kind="option", example="--option micro_batches=8",
        help="strategy option, repeatable: mesh=2x2, micro_batches=8, bucket_mb=25 (TOML: [options])")
    backend_strategies: dict[str, list[str]] = setting(
        default={}, example='[backend_strategies] gloo = ["ddp"]',
        help="per backend, the only strategies it runs; a backend not named runs every strategy of the run (the "
             "default GPU matrix asks Gloo only how DDP fares without NCCL)")
    workload_matrix: dict[str, dict[str, list]] = setting(
        default={}, example='[workload_matrix."gpt-20b"] strategies = ["fsdp"]',
        help="per workload (as written in workloads), the part of the run's strategies, backends and world sizes it "
             "runs; its single-device reference is planned all the same")


@dataclass(frozen=True, kw_only=True)
class MeasurementSettings:
    """How each cell is measured: steps, the adaptive loops that extend them, rounds and time limits.

    Warm-up continues past ``warmup`` until the step time settles (up to ``warmup_max``); timed steps
    continue past ``steps`` until the median's 95% interval is within ``target_ci``, ``steps_max``
    or ``time_cap_s``; each cell is measured ``repeats`` times in rounds ordered by a balanced Latin
    square (bench.train.rounds)."""

    steps: int = setting(20, flag="--steps", kind="int", example="--steps 20",
                         help="timed steps per cell (default 20 on CPU, 30 with GPUs)")
    warmup: int = setting(3, flag="--warmup", kind="int", example="--warmup 3",
                          help="untimed warm-up steps per cell (default 3 on CPU, 5 with GPUs)")
    repeats: int = setting(1, flag="--repeats", kind="int", example="--repeats 3",
                           help="measure each cell N times, in rounds ordered by a balanced Latin square (default 1)")
    warmup_max: int | None = setting(None, flag="--warmup-max", kind="int", example="--warmup-max 20",
                                     help="warm-up continues until the step time settles, up to this "
                                          "(default 4 x --warmup; 0: exactly --warmup)")
    steps_max: int | None = setting(None, flag="--steps-max", kind="int", example="--steps-max 100",
                                    help="timed steps continue until --target-ci, up to this (default 3 x --steps; "
                                         "0: exactly --steps)")
    settle: float = setting(0.01, kind="float", example="settle = 0.01",
                            help="settled: the median of the last 5 warm-up steps moved less than this fraction")
    target_ci: float = setting(0.02, flag="--target-ci", kind="float", example="--target-ci 0.02",
                               help="relative half-width of the median's 95%% interval to reach (default 0.02; "
                                    "0 = fixed step count)")
    time_cap_s: float = setting(20.0, flag="--time-cap", kind="float", example="--time-cap 20",
                                help="seconds of timed steps after which no more are added; the adaptive warm-up "
                                     "adds no more after half of it (default 20; 0: no cap)")
    cell_timeout_s: float = setting(300.0, flag="--cell-timeout", kind="float", example="--cell-timeout 300",
                                    help="seconds from a cell's start before it is a timeout (default 300; 120 on CPU)")
    startup_timeout_s: float = setting(
        300.0, flag="--startup-timeout", kind="float", example="--startup-timeout 300",
        help="seconds a process group may take to start (torchrun, imports, rendezvous, warm-up) before its first "
             "cell (default 300): a loaded machine imports slowly, which is no cell's fault")
    parity_tol: float | None = setting(
        None, flag="--parity-tol", kind="float", example="--parity-tol 1e-4",
        help="relative tolerance of every cell's parity check against one device (default: 300x the reference's "
             "own rounding, up to 1e-3, at least 1e-5 in fp32, 1e-3 in fp32 under Adam and AdamW, 2e-2 in bf16; "
             "a workload may set its own)")
    workload_timeout_s: float = setting(
        120.0, flag="--workload-timeout", kind="float", example="--workload-timeout 120",
        help="seconds a package.module:factory workload may take to import and build while the run is planned "
             "(default 120)")


@dataclass(frozen=True, kw_only=True)
class BudgetSettings:
    """The run's time budget: repeats, steps and caps planned to fit it, and what is left of it
    spent on the decisions still open (bench.train.adaptive)."""

    duration: str | None = setting(None, flag="--budget", key="budget", example="--budget 10m",
                                   help="time budget for the whole run, e.g. 10m: repeats, steps and caps are planned "
                                        "to fit (default 10m with GPUs, 4m on CPU; 'off' for none)")
    adaptive: bool = setting(True, flag="--no-adaptive", kind="off", example="--no-adaptive",
                             help="under a budget, do not measure again the cells of decisions still open after "
                                  "one repeat")
    search: str = setting(
        "auto", flag="--search", choices=("auto", "off", "wide"), example="--search wide",
        help="after the screening pass, search the knobs of the leading strategies (compile, checkpointing, "
             "batch per device, their options) within the budget: auto (default: under a budget, on one node), "
             "off, or wide (more batches and leaders: `parbench tune`)")
    pinned: list[str] = setting(default=[], toml=False,
                                help="the measurement settings the user gave: a budget plan keeps them as given")


@dataclass(frozen=True, kw_only=True)
class TrainingSettings:
    """How the cells train: each knob of bench.core.knobs a list of values (several expand the matrix:
    every combination runs, against a one-device reference trained the same way), and the rate."""

    knobs: dict[str, list[str]] = setting(default=knobs.defaults(), key="training",
                                          example='[training] compile = ["off", "on"]',
                                          help="the training knobs, each a list of values (see `parbench list`)")
    lr: float | None = setting(None, flag="--lr", kind="float", example="--lr 3e-4",
                               help="learning rate (default: 1e-2 for sgd, 3e-4 for adam and adamw)")


@dataclass(frozen=True, kw_only=True)
class ProfilingSettings:
    """What is recorded beside the timed steps: telemetry, the profiled steps' breakdown, traces."""

    sample_hz: float = setting(20.0, flag="--sample-hz", kind="float", example="--sample-hz 20",
                               help="telemetry sampling rate, 0 = off (default 20, max 1000)")
    profile_steps: int = setting(2, flag="--profile-steps", kind="int", example="--profile-steps 2",
                                 help="steps profiled after the timed ones for the compute/comm breakdown (default 2; "
                                      "0 = off)")
    profile_at: str = setting("auto", flag="--profile-at", choices=("auto", "end", "inline"),
                              example="--profile-at end",
                              help="when the profiled steps run: end (after every timed step of the process group, in "
                                   "a pass that builds each cell again: no timed step follows a GPU profiler session), "
                                   "inline (right after each cell's first timed repeat), auto (default: end on cuda, "
                                   "inline on cpu)")
    memory_probe: str = setting("auto", flag="--memory-probe", choices=("auto", "on", "off"),
                                example="--memory-probe on",
                                help="the memory model's activation probe, one forward and backward of each workload "
                                     "on one device before the ranks start: auto (default: on a GPU), on, off "
                                     "(predictions are then lower bounds)")
    trace: bool = setting(False, flag="--trace", kind="on", example="--trace",
                          help="keep each rank's Chrome trace (opens in Perfetto) under RUN/traces/")


@dataclass(frozen=True, kw_only=True)
class NodeSettings:
    """Past one machine (bench/multinode, docs/guides/multinode.md): the same plan on ``nnodes``
    nodes, this one ``node_rank``; torchrun's c10d rendezvous at ``rdzv_endpoint``, hosted by node
    0's launcher. Cells of one process run on node 0 alone; every other cell spans every node."""

    nnodes: int = setting(1, flag="--nnodes", kind="int", example="--nnodes 2",
                          help="machines the run spans, each running this command (default 1)")
    node_rank: int = setting(0, flag="--node-rank", kind="int", example="--node-rank 1",
                             help="this machine's rank, 0..nnodes-1; node 0 hosts the rendezvous and writes the tables")
    rdzv_endpoint: str | None = setting(None, flag="--rdzv-endpoint", example="--rdzv-endpoint 10.0.0.1:29400",
                                        help="node 0's address for torchrun's c10d rendezvous (default "
                                             "127.0.0.1:29400, loopback)")
    rdzv_timeout_s: float = setting(300.0, flag="--rdzv-timeout", kind="float", example="--rdzv-timeout 300",
                                    help="seconds to wait for every node to join (default 300)")


@dataclass(frozen=True, kw_only=True)
class OutputSettings:
    """Where the run folder goes."""

    out: str = setting("results", flag="--out", example="--out results",
                       help="results folder (default: results); the run is RUN = OUT/<run-id>/")


#: The sections, by their name in TOML (``[measurement]``) and as RunConfig's attribute
SECTIONS: dict[str, type] = {"matrix": MatrixSettings, "measurement": MeasurementSettings, "budget": BudgetSettings,
                             "training": TrainingSettings, "profiling": ProfilingSettings, "nodes": NodeSettings,
                             "output": OutputSettings}


@dataclass(frozen=True)
class Declared:
    """One setting: its flat key (TOML, meta.json), section, field and declaration."""

    key: str
    section: str
    name: str
    field: dataclasses.Field

    def __getattr__(self, item: str) -> Any:
        try:
            return self.field.metadata[item]
        except KeyError:
            raise AttributeError(item) from None

    @property
    def default(self) -> Any:
        f = self.field
        return f.default_factory() if f.default is dataclasses.MISSING else f.default  # type: ignore[misc]

    @property
    def dest(self) -> str:
        """The argparse destination of its flag: the flat key (the switch --no-adaptive sets adaptive)."""
        return self.key


def _declared() -> tuple[Declared, ...]:
    out = []
    for sec, cls in SECTIONS.items():
        for f in dataclasses.fields(cls):
            out.append(Declared(f.metadata.get("key") or f.name, sec, f.name, f))
    return tuple(out)


#: Every setting, in declaration order
DECLARED: tuple[Declared, ...] = _declared()
#: Every setting by its flat key
BY_KEY: dict[str, Declared] = {d.key: d for d in DECLARED}


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """A run's settings, by section. ``cfg.measurement.steps``; flat (``cfg.flat()``, as TOML keys
    and meta.json hold them) for storage."""

    matrix: MatrixSettings = field(default_factory=MatrixSettings)
    measurement: MeasurementSettings = field(default_factory=MeasurementSettings)
    budget: BudgetSettings = field(default_factory=BudgetSettings)
    training: TrainingSettings = field(default_factory=TrainingSettings)
    profiling: ProfilingSettings = field(default_factory=ProfilingSettings)
    nodes: NodeSettings = field(default_factory=NodeSettings)
    output: OutputSettings = field(default_factory=OutputSettings)

    @classmethod
    def from_flat(cls, flat: dict[str, Any]) -> RunConfig:
        """From flat keys (every one known; a missing one takes its default). TypeError names an
        unknown key."""
        unknown = [k for k in flat if k not in BY_KEY]
        if unknown:
            raise TypeError(f"unknown setting {unknown[0]!r}")
        parts: dict[str, dict[str, Any]] = {s: {} for s in SECTIONS}
        for k, v in flat.items():
            d = BY_KEY[k]
            parts[d.section][d.name] = v
        return cls(**{s: SECTIONS[s](**kw) for s, kw in parts.items()})

    def flat(self) -> dict[str, Any]:
        """Every setting by its flat key, as meta.json's ``config`` holds it."""
        return {d.key: _copy(getattr(getattr(self, d.section), d.name)) for d in DECLARED}

    def to_dict(self) -> dict[str, Any]:
        return self.flat()

    def replace(self, **flat: Any) -> RunConfig:
        """A copy with the settings of ``flat`` (flat keys) changed."""
        return RunConfig.from_flat({**self.flat(), **flat})

    def effective_precision(self) -> str:
        p = self.matrix.precision
        if p != "auto":
            return p
        return "bf16" if self.matrix.device == "cuda" else "fp32"


def _copy(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: _copy(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_copy(x) for x in v]
    return v


def flatten_toml(data: dict[str, Any]) -> dict[str, Any]:
    """A TOML file's settings as flat keys: flat keys as they are, a section's table
    (``[measurement] steps = 20``) as its keys, and [training]'s ``lr`` beside its knobs. A key
    that is neither stays, for the caller's one-line error."""
    flat: dict[str, Any] = {}
    for k, v in data.items():
        if k == "training" and isinstance(v, dict):
            table = dict(v)
            if "lr" in table:
                flat["lr"] = table.pop("lr")
            flat["training"] = table
        elif k in SECTIONS and isinstance(v, dict):
            for sub, x in v.items():
                d = BY_KEY.get(sub)
                flat[sub if d is not None and d.section == k else f"{k}.{sub}"] = x
        else:
            flat[k] = v
    return flat


def add_flags(parser: Any, *, sections: tuple[str, ...] | None = None, grouped: bool = True) -> None:
    """The flags of the settings of ``sections`` (default: every section but nodes), one argument
    group per section with ``grouped`` (a parser), else all into ``parser`` (itself a group)."""
    for sec, cls in SECTIONS.items():
        if (sections is None and sec == "nodes") or (sections is not None and sec not in sections):
            continue
        title = (cls.__doc__ or "").split("\n\n")[0]
        where = parser.add_argument_group(f"{sec} settings", title) if grouped else parser
        for d in DECLARED:
            if d.section == sec and d.flag:
                _add_flag(where, d)
        if sec == "training":
            knobs.add_flags(where)


def _add_flag(p: Any, d: Declared) -> None:
    kw: dict[str, Any] = {"dest": d.dest, "help": d.help}
    if d.kind == "on":
        kw.update(action="store_true", default=None)
    elif d.kind == "off":
        kw.update(action="store_false", default=None)
    elif d.kind == "option":
        kw.update(action="append", metavar="KEY=VALUE", default=[], dest="option")
    else:
        kw["type"] = {"int": int, "float": float}.get(d.kind, str)
        if d.choices:  # checked by bench.core.config, whose one line names the value and the fix
            kw["metavar"] = "|".join(d.choices)
    p.add_argument(d.flag, **kw)


def flag_keys() -> frozenset[str]:
    """The settings a ``run`` flag sets directly (its argparse destination is the key)."""
    return frozenset(d.key for d in DECLARED if d.flag and d.kind != "option")


def column_doc(key: str) -> str:
    """The description of a row column that holds the setting ``key`` as the cell ran it."""
    d = BY_KEY[key]
    return f"the cell's {d.flag or d.key} (a budget plans it where the user did not give it): {d.help}"


def listing() -> list[tuple[str, list[tuple[str, str]]]]:
    """Per section, (how to give it, its help) for `parbench list` and the settings guide."""
    out = []
    for sec in SECTIONS:
        rows = []
        for d in DECLARED:
            if d.section == sec and d.toml:
                rows.append((d.flag or f"TOML {d.key}", d.help))
        if sec == "training":
            rows = [r for r in rows if r[0] != "TOML training"] + knobs.listing()
        out.append((sec, rows))
    return out
