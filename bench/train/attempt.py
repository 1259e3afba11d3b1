"""One launch of a process group: what the launcher knows of it while it runs and after it ended.
The group's state across its launches (the cells pending, the attempt count, whether a launch had
to be killed) is :class:`bench.train.group.GroupRun`'s."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from bench.core import spec
from bench.core.spec import CellSpec
from bench.runtime.process import Launch


def _marks() -> dict[str, float | None]:
    return {"first_cell": None, "last_cell": None, "exited": None}


@dataclass(kw_only=True)
class Attempt:
    """One launch (``number``: the group's attempt) of the plan at ``prefix``.json: the torchrun
    process (``launch``), when it was started (``launched``, unix) and the marks of its start-up
    record, the notes on it, the cell running, each cell's first rank error, when to stop a group
    desynchronised by one, how it ended (the worker said it stopped, it timed out, it reached the
    profile pass), the limit its start-up or its running cell must meet (``deadline``, monotonic),
    the nodes lost, the other nodes' outcomes, and the events read but not yet handled."""

    number: int
    prefix: str
    launch: Launch
    launched: float
    startup_s: float  # the start-up's own limit, until the first cell starts (then each cell's)
    marks: dict[str, float | None] = field(default_factory=_marks)
    notes: list[str] = field(default_factory=list)
    current: CellSpec | None = None
    errors: dict[int, tuple[float, str]] = field(default_factory=dict)  # cell -> (when, "rank R: reason")
    desync_at: float | None = None  # when to stop a group still inside a cell that a rank failed
    started_any: bool = False
    stopped: bool = False
    timed_out: bool = False
    in_pass: bool = False  # the worker reached the profile pass (every timed repeat of the launch is in)
    deadline: float = 0.0
    lost: dict[int, str] = field(default_factory=dict)
    remote: dict[int, dict[str, Any]] = field(default_factory=dict)
    queue: list[spec.Event] = field(default_factory=list)  # read, not handled: a signal between must not lose them

    def __post_init__(self) -> None:
        self.deadline = time.monotonic() + self.startup_s

    def rearm(self, limit_s: float) -> None:
        """The running cell's limit counts from now."""
        self.deadline = time.monotonic() + limit_s

    def head(self, label: str) -> str:
        """``<group> attempt <n>``: how notes on this launch begin."""
        return f"{label} attempt {self.number}"
