"""The training knobs: how a cell trains (optimizer, torch.compile, activation checkpointing).

Each knob is declared once, as a field of :class:`Training` with its choices, default, help and the
value a run recorded before the knob existed. From that one declaration come the ``run`` flag
(``--optimizer adamw,sgd``), the TOML key (``[training] optimizer = ["adamw"]``), the row column
(``optimizer``), the ``parbench list`` text and the columns guide. Several values of a knob expand
the matrix: every cell runs under each combination, against a one-device reference trained the same
way. The module is torch-free: the planner, the readers and the CLI import it.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass, field
from typing import Any

from bench.core.errors import UserError


def knob(*, default: str, choices: tuple[str, ...], legacy: str, help: str, doc: str) -> Any:
    """A knob's field: ``legacy`` is the value a run recorded before the knob existed (compare and
    history read a missing column as it), ``help`` the flag's text, ``doc`` the column's."""
    return field(default=default, metadata={"knob": True, "choices": choices, "legacy": legacy, "help": help,
                                            "doc": doc})


#: The learning rate each optimizer trains with unless --lr is given: SGD's step is the gradient
#: times lr; Adam's is about lr per parameter whatever the gradient's scale, so it takes a smaller one.
DEFAULT_LR = {"sgd": 1e-2, "adam": 3e-4, "adamw": 3e-4}


@dataclass(frozen=True, kw_only=True)
class Training:
    """How one cell trains. The knob fields are what the user chooses; ``lr`` is resolved per
    optimizer at plan time."""

    optimizer: str = knob(
        default="adamw", choices=("adamw", "adam", "sgd"), legacy="sgd",
        help="optimizer (comma list to compare): adamw (default; fused on CUDA, fp32 state), adam, sgd",
        doc="the optimizer the cell trains with (AdamW fused on CUDA; its fp32 state is held where the strategy "
            "keeps it: whole under DDP, sharded under FSDP2 and ZeRO-1)")
    compile: str = knob(
        default="off", choices=("off", "on"), legacy="off",
        help="torch.compile (comma list to compare): off (default), on (per block under FSDP2, TP and pipelines, "
             "the whole module on one device and DDP); compilation is timed apart, never in the steps",
        doc="whether the model was compiled with torch.compile (as the strategy applies it: see `parbench list`)")
    ac: str = knob(
        default="none", choices=("none", "full", "selective"), legacy="none",
        help="activation checkpointing per block (comma list to compare): none (default), full (every block "
             "recomputed in backward), selective (matmul and attention outputs kept, the rest recomputed)",
        doc="activation checkpointing per block: none, full or selective (op-level: matmul and attention outputs "
            "saved)")
    lr: float = DEFAULT_LR["adamw"]

    def knobs(self) -> dict[str, str]:
        """The knob values by name (the row's columns)."""
        return {f.name: getattr(self, f.name) for f in KNOBS}

    def short(self) -> str:
        """The values that differ from the defaults, for titles: 'compile=on ac=full' ('' when none)."""
        return short(self.knobs())


#: The knob fields, in declaration order
KNOBS: tuple[dataclasses.Field, ...] = tuple(f for f in dataclasses.fields(Training) if f.metadata.get("knob"))
NAMES: tuple[str, ...] = tuple(f.name for f in KNOBS)


def short(values: dict, names: list[str] | None = None) -> str:
    """'compile=on ac=full': the knob values of ``values`` (a row, a dict) that differ from their
    defaults, or those of ``names`` whatever their value, for titles and the answer's lines ('' when
    none)."""
    return " ".join(f"{f.name}={values[f.name]}" for f in KNOBS
                    if isinstance(values.get(f.name), str) and values[f.name]
                    and (f.name in names if names is not None else values[f.name] != f.default))


def varying(cells) -> list[str]:
    """The knobs whose value differs between the rows of ``cells`` (a DataFrame): what a line about
    one of them names, since the rest is the run's."""
    return [n for n in NAMES if n in cells and cells[n].nunique(dropna=True) > 1]


def defaults() -> dict[str, list[str]]:
    """Each knob's default, as the one-value list a run's configuration holds."""
    return {f.name: [f.default] for f in KNOBS}


def legacy() -> dict[str, str]:
    """What a run recorded before the knobs existed trained with: SGD, eager, no checkpointing."""
    return {f.name: f.metadata["legacy"] for f in KNOBS}


def validate(given: Any) -> dict[str, list[str]]:
    """The [training] table (or the flags): each known knob a non-empty list of its choices, the
    defaults for the rest; a one-line UserError otherwise."""
    if not isinstance(given, dict):
        raise UserError('training must be a TOML table, e.g. [training] optimizer = ["adamw"]')
    unknown = [k for k in given if k not in NAMES]
    if unknown:
        raise UserError(f"training: unknown knob {unknown[0]!r}; known: {', '.join(NAMES)}")
    out = defaults()
    for f in KNOBS:
        if given.get(f.name) is None:
            continue
        vals = given[f.name]
        vals = [v.strip() for v in vals.split(",")] if isinstance(vals, str) else vals
        if not isinstance(vals, list) or not vals or not all(isinstance(v, str) for v in vals):
            raise UserError(f"--{f.name} {vals!r}: give one or more of {', '.join(f.metadata['choices'])}, "
                            f"e.g. --{f.name} {f.default}")
        bad = [v for v in vals if v not in f.metadata["choices"]]
        if bad:
            raise UserError(f"--{f.name} {bad[0]!r} unknown; use {', '.join(f.metadata['choices'])} "
                            f"(a comma list to compare), e.g. --{f.name} {f.default}")
        out[f.name] = list(dict.fromkeys(vals))
    return out


def combinations(values: dict[str, list[str]], lr: float | None) -> list[Training]:
    """Every combination of the run's knob values, in the order given (the first value of each
    knob first), each with its learning rate: ``lr`` when given, else its optimizer's default."""
    out = []
    for combo in itertools.product(*(values[n] for n in NAMES)):
        chosen = dict(zip(NAMES, combo))
        out.append(Training(**chosen, lr=DEFAULT_LR[chosen["optimizer"]] if lr is None else lr))
    return out


def add_flags(parser) -> None:
    """One ``--<knob>`` flag per knob, its help from the declaration."""
    for f in KNOBS:
        parser.add_argument(f"--{f.name}", dest=f"knob_{f.name}", metavar="|".join(f.metadata["choices"]),
                            help=f.metadata["help"])


def from_flags(args) -> dict[str, str]:
    """The knob flags the user gave, by knob name."""
    return {f.name: getattr(args, f"knob_{f.name}") for f in KNOBS
            if getattr(args, f"knob_{f.name}", None) is not None}


def listing() -> list[tuple[str, str]]:
    """(knob, its help) for `parbench list`."""
    return [(f"--{f.name} {'|'.join(f.metadata['choices'])}", f.metadata["help"]) for f in KNOBS]
