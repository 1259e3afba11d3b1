"""What the launcher holds of a cell across launches: its repeats, telemetry and wall times until
its row is written, and after, what a launch that measures it again starts from."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from bench.core import spec
from bench.core.spec import CellSpec, RankMeasurement, deferred
from bench.stats.steps import slowest_profiled_step, slowest_steps


@dataclass(kw_only=True)
class Pending:
    """What the launcher holds of a cell until its last repeat arrives, and after: its row, and
    what a later launch that measures it again (the run's adaptive repeats) starts from."""

    spec: CellSpec
    repeats: list[list[RankMeasurement]] = field(default_factory=list)
    telemetry: list[dict[str, float]] = field(default_factory=list)
    wall_s: float = 0.0
    repeat_wall_s: list[float] = field(default_factory=list)  # each timed repeat's wall time
    written: int = 0  # repeats whose steps are in the run folder (0: no row written yet)
    awaits_pass: bool | None = None  # its profiled steps come from the group's profile pass
    row: dict[str, Any] | None = None  # the row last written

    def __post_init__(self) -> None:
        if self.awaits_pass is None:
            self.awaits_pass = deferred(self.spec)

    def timed(self) -> bool:
        """Every planned repeat is in (only a deferred profile pass may be left)."""
        return len(self.repeats) >= self.spec.measure.repeats

    def again(self, repeats: int, time_cap_s: float | None = None) -> Pending:
        """This cell measured again up to ``repeats`` in all (its timed steps capped at
        ``time_cap_s`` when given): its repeats so far. A cell with a deferred breakdown may get a
        profile pass again, which the worker runs only if the new repeats move the timed median
        further than BREAKDOWN_GAP_MAX from :meth:`span` (GroupPlan.held)."""
        cap = {} if time_cap_s is None else {"time_cap_s": time_cap_s}
        spec2 = dataclasses.replace(self.spec, measure=dataclasses.replace(self.spec.measure, repeats=repeats, **cap))
        return dataclasses.replace(self, spec=spec2, repeats=list(self.repeats), telemetry=list(self.telemetry),
                                   repeat_wall_s=list(self.repeat_wall_s),
                                   awaits_pass=deferred(self.spec) and self.span() is not None)

    def span(self) -> float | None:
        """The slowest rank's profiled step behind the cell's breakdown (None without one)."""
        return slowest_profiled_step(r.breakdown for r in (self.repeats[0] if self.repeats else ()))

    def settled(self) -> int | None:
        """The warm-up steps the cell's first repeat took to settle (None before it ran)."""
        return max((r.warmup_steps for r in self.repeats[0]), default=None) if self.repeats else None

    def steps(self) -> list[list[float]]:
        """Each repeat's steps, the slowest rank's (what the cell's timed median is taken over)."""
        return [slowest_steps([r.times for r in rep]).tolist() for rep in self.repeats]

    def merge_profile(self, ev: spec.Profiled) -> str:
        """The profile pass's breakdown and records into the first repeat; '' or why it failed."""
        self.wall_s += ev.wall_s
        bad = [r for r in ev.ranks if r.status != "ok"]
        if bad:
            first = min(bad, key=lambda r: r.rank)
            return f"profile pass failed on rank {first.rank}: {first.reason}"
        mine = {r.rank: r for r in ev.ranks}
        for r in self.repeats[0] if self.repeats else []:
            got = mine.get(r.rank)
            if got is not None:
                r.breakdown, r.comm, r.profile_s = got.breakdown, got.comm, r.profile_s + got.profile_s
                if got.comm_calls_per_step is not None:
                    r.comm_calls_per_step, r.comm_bytes_per_step = got.comm_calls_per_step, got.comm_bytes_per_step
        return ""


def unprofiled(c: CellSpec) -> CellSpec:
    """A cell measured again that gets no profile pass (:meth:`Pending.again`): no profiled steps."""
    return dataclasses.replace(c, measure=dataclasses.replace(c.measure, profile_steps=0))
