"""What travels together through a training run: the plan of this invocation (:class:`RunPlan`)
and what every launch of the run shares (:class:`GroupContext`), one object each, handed from the
launcher to each group, each launch and each adaptive round."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from bench.core.settings import RunConfig
from bench.core.spec import CellSpec
from bench.multinode.nodes import Coordinator
from bench.plan.matrix import Planned
from bench.results.store import RunWriter
from bench.train.pending import Pending
from bench.train.run_folder import Telemetry


@dataclass(frozen=True, kw_only=True)
class Progress:
    """What the launcher tells its caller: the plan (``n`` runnable cells), ``n`` more cell runs
    about to start (a group of an adaptive round), a note, a group starts (``n`` cells), a cell
    starts or is done."""

    kind: Literal["plan", "more", "note", "group", "start", "done"]
    group: str
    cell: CellSpec | None = None
    n: int = 0
    status: str = ""
    text: str = ""


ProgressFn = Callable[[Progress], None]


def _quiet(_p: Progress) -> None:
    return None


@dataclass(frozen=True, kw_only=True)
class RunPlan:
    """What this invocation runs: its cells (a resume leaves out those it found done), the
    workloads' descriptions (for meta.json), the time budget's plan text and seconds."""

    cells: list[Planned]
    described: dict[str, str] = field(default_factory=dict)
    text: str = ""
    budget_s: float | None = None
    gpus: int = 0  # the GPUs visible (a strategy's check of a cell the search plans reads them)
    searched: bool = False  # a resumed run whose search had begun (its folder has cells beyond the plan)


@dataclass(frozen=True, kw_only=True)
class GroupContext:
    """What every group and launch of a run shares: the config, the run's writer and work folder,
    its telemetry, where progress goes, the traces folder, the time budget's deadline (unix), the
    notes on processes that outlived their launch (``survivors``), each launch's start-up record
    (``starts``), every cell whose row is written with what later launches start from (``kept``),
    and, on several nodes, node 0's coordinator. Frozen: a step of the run that needs another
    deadline takes a copy (:func:`dataclasses.replace`); the lists and dicts are the run's own."""

    cfg: RunConfig
    writer: RunWriter
    work: Path
    telemetry: Telemetry
    report: ProgressFn = _quiet
    trace_dir: Path | None = None
    deadline: float | None = None
    survivors: list[str] = field(default_factory=list)
    starts: list[dict[str, Any]] = field(default_factory=list)
    kept: dict[int, Pending] = field(default_factory=dict)
    coord: Coordinator | None = None
