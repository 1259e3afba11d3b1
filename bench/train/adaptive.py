"""Adaptive repeats: after the screening pass has measured every cell, repeats go where a decision
is still open, until each is resolved or the budget ends.

A decision (per workload, backend and world size: :func:`bench.decide.recommend.recommend`) is
open when a pair of cells it rests on is neither separated beyond the noise nor the same speed; it
names those cells and about how many repeats a cell would close it. Each round measures the open
decisions' cells ``ROUND_REPEATS`` more times (at least 3 in all, the fewest an interval from
repeats needs), in their own process groups, interleaved in rounds as every group is
(:mod:`bench.train.rounds`); a cell is profiled again only when its new repeats move its timed
median further than BREAKDOWN_GAP_MAX from its breakdown's step (:meth:`Pending.again`). Each
measured cell's row is written again with all its repeats; it supersedes the earlier one
(:func:`bench.results.store.latest_rows`), so a run stopped at any point keeps every cell's latest
row. Decisions that repeats cannot close (a contended host, an efficiency that is not physical, a
gap that would need more than ``MAX_REPEATS`` repeats) are left as they are; a round that does not
fit the time left is cut to the decisions that do, the real workloads' before the launch-bound ones.
"""

from __future__ import annotations

import dataclasses
import logging
import statistics
import time
from typing import Any

from bench.core.text import counted
from bench.decide import picks as run_picks
from bench.decide.decision import Decision
from bench.decide.rules import MAX_REPEATS
from bench.plan.budget import GROUP_START_S
from bench.plan.matrix import Planned, group
from bench.results.run import load_run
from bench.train.context import GroupContext, Progress
from bench.train.group import run_group
from bench.train.pending import Pending

log = logging.getLogger("parbench")

#: repeats a round adds to each cell of an open decision
ROUND_REPEATS = 2
#: the share of a time budget the screening pass leaves for open decisions
RESERVE = 0.35
#: rounds at most (each costs a process start per group)
MAX_ROUNDS = 6
#: the shortest timed-step cap a round gives a repeat (seconds)
MIN_CAP_S = 0.5
#: a further repeat's compile seconds as a share of a compiled cell's first, before it has a second:
#: a new process compiles again, from the on-disk caches (on one H200, gpt-200m compiled in 21 s with
#: cold caches and in 0.6-1.5 s with warm ones: docs/evidence/search-run-h200.csv)
CACHED_COMPILE_SHARE = 0.25


@dataclasses.dataclass(frozen=True)
class Ask:
    """One open decision's request: its cells, each to be measured up to ``targets[cell]`` repeats
    in all, and per cell (repeats to add, seconds a repeat spends outside its timed steps, seconds
    of timed steps a repeat took), from each cell's own repeats so far."""

    pick: Decision  # or what stands for one: its title and launch_bound (bench.train.search)
    targets: dict[int, int]
    slots: tuple[tuple[int, float, float], ...]

    def cost(self, cap_s: float | None = None) -> float:
        """Seconds its repeats take with their timed steps capped at ``cap_s`` (None: as before)."""
        return sum(k * (fixed + (timed if cap_s is None else min(timed, cap_s))) for k, fixed, timed in self.slots)


def repeat_parts(p: Pending, again: bool = False) -> tuple[float, float]:
    """(seconds outside the timed steps, seconds of timed steps) of a typical repeat of ``p``: the
    median repeat's wall time, and its slowest rank's timed steps. ``again``: of a further repeat of
    this same cell, whose compilation mostly hits the graphs its first repeat left in inductor's and
    AOTAutograd's on-disk caches: its later repeats' compile seconds where it has them, else
    CACHED_COMPILE_SHARE of its first's."""
    walls = p.repeat_wall_s or [p.wall_s / max(len(p.repeats), 1)]
    timed = [max((sum(r.times) for r in rep), default=0.0) for rep in p.repeats] or [0.0]
    wall, t = statistics.median(walls), statistics.median(timed)
    fixed = max(wall - t, 0.0)
    compiles = [max((r.compile_s or 0.0 for r in rep), default=0.0) for rep in p.repeats]
    if again and any(compiles):
        expect = statistics.median(compiles[1:]) if len(compiles) > 1 else compiles[0] * CACHED_COMPILE_SHARE
        fixed = max(fixed - statistics.median(compiles) + expect, 0.0)
    return fixed, t


def asks(picks: list[Decision], kept: dict[int, Pending]) -> list[Ask]:
    """The open decisions that repeats can close, real workloads first, then the cheapest."""
    out = [ask_for(p, p.open_cells, kept) for p in picks
           if not p.resolved and p.open_cells and p.repeats_needed is not None]
    return sorted((a for a in out if a is not None), key=lambda a: (a.pick.launch_bound, a.cost()))


def ask_for(pick: Any, cells, kept: dict[int, Pending]) -> Ask | None:
    """The request of ``pick`` (a decision, or anything with its ``title`` and ``launch_bound``) for
    ``cells``: each measured so far up to ROUND_REPEATS more repeats (3 at least, MAX_REPEATS at
    most); None when none of them needs more."""
    targets, slots = {}, []
    for cid in cells:
        have = kept.get(cid)
        if have is None:
            continue
        n = len(have.repeats)
        target = min(max(n + ROUND_REPEATS, 3), MAX_REPEATS)
        if target > n:
            targets[cid] = target
            slots.append((target - n, *repeat_parts(have, again=True)))
    return Ask(pick=pick, targets=targets, slots=tuple(slots)) if targets else None


def round_cap(wanted: list[Ask], left_s: float, start_s: float, cap_s: float | None) -> float | None:
    """The timed-step cap of a round's repeats: the screening's (``cap_s``), lowered so that every
    open decision's repeats fit the time left when they would not (what a decision needs is more
    repeats, not longer ones), but not below MIN_CAP_S."""
    more = sum(k for a in wanted for k, _, _ in a.slots)
    if not more or cap_s is None:
        return cap_s
    fixed = sum(k * f for a in wanted for k, f, _ in a.slots) + start_s * 3
    fits = (left_s / 1.25 - fixed) / more
    return max(min(cap_s, fits), MIN_CAP_S)


def launch_cost(starts: list[dict[str, Any]], device: str) -> float:
    """What a process group costs to start and stop on this machine: the median of the run's own
    launches so far (start-up and teardown), else the budget model's figure."""
    seen = [s["start_s"] + (s.get("teardown_s") or 0.0) for s in starts
            if isinstance(s.get("start_s"), int | float)]
    return statistics.median(seen) if seen else GROUP_START_S[device]


def fit(wanted: list[Ask], kept: dict[int, Pending], left_s: float, start_s: float,
        cap_s: float | None = None) -> dict[int, int]:
    """The cells (and their repeats) of the asks that fit ``left_s``, in order: the repeats' own
    time (timed steps capped at ``cap_s``) and ``start_s`` for each process group they need, with a
    25% margin."""
    chosen: dict[int, int] = {}
    cost, groups = 0.0, set()
    for a in wanted:
        keys = {(kept[c].spec.n_procs, kept[c].spec.nnodes, kept[c].spec.backend) for c in a.targets}
        total = cost + a.cost(cap_s) + start_s * len(groups | keys)
        if 1.25 * total > left_s:
            continue
        for cid, t in a.targets.items():
            chosen[cid] = max(t, chosen.get(cid, 0))
        cost += a.cost(cap_s)
        groups |= keys
    return chosen


def covered(wanted: list[Ask], chosen: dict[int, int]) -> int:
    """How many of ``wanted`` the cells ``chosen`` (:func:`fit`) measure whole."""
    return sum(all(chosen.get(c, 0) >= t for c, t in a.targets.items()) for a in wanted)


def fit_every(wide: list[Ask], narrow: list[Ask], kept: dict[int, Pending], left_s: float, start_s: float,
              cap_s: float | None = None) -> dict[int, int]:
    """A round's cells: every ask of ``wide`` (each slot's last three) where they all fit, else
    whichever of ``wide`` and ``narrow`` (each slot's last two) :func:`fit` measures more of
    ``narrow``'s asks whole with, ``wide`` on a tie. A slot a round leaves out is left to the noise,
    in a run and in its re-run alike, so every slot's fastest two come before some slots' three.
    Both choices are counted against ``narrow``, not each against its own list: a slot whose fastest
    two already have all their repeats asks only for its third, in ``wide``, so the lists' lengths
    differ and their own counts do not compare."""
    chosen = fit(wide, kept, left_s, start_s, cap_s)
    if covered(wide, chosen) == len(wide) or not narrow:
        return chosen
    other = fit(narrow, kept, left_s, start_s, cap_s)
    return other if covered(narrow, other) > covered(narrow, chosen) else chosen


def decide(ctx: GroupContext, searched: set[int] | None = None) -> list[dict[str, Any]]:
    """Rounds of repeats for the open decisions until none is left that repeats can close, the
    time left fits none, or MAX_ROUNDS (``ctx.deadline``: the run's, never None here); returns what
    each round did (for meta.json). The cells measured so far are ``ctx.kept``; ``searched``: the
    knob search's, which answer another question (:func:`bench.decide.picks.decide`)."""
    cfg, kept, writer, report, starts = ctx.cfg, ctx.kept, ctx.writer, ctx.report, ctx.starts
    deadline = ctx.deadline if ctx.deadline is not None else time.time()  # none: no round fits
    done: list[dict[str, Any]] = []
    for k in range(1, MAX_ROUNDS + 1):
        # the folder as this round left it, the knob search's cells aside (``searched``)
        picks = run_picks.decide(load_run(writer.dir), searched_ids=searched)
        wanted = asks(picks, kept)
        if not wanted:
            break
        left = deadline - time.time()
        start_s = launch_cost(starts, cfg.matrix.device)
        caps = [p.spec.measure.time_cap_s for p in kept.values() if p.spec.measure.time_cap_s]
        cap = round_cap(wanted, left, start_s, max(caps) if caps else None)
        chosen = fit(wanted, kept, left, start_s, cap)
        if not chosen:
            report(Progress(kind="note", group="", text=f"decisions still open: {len(wanted)}; the time left "
                                                        f"({max(left, 0):.0f}s) fits no more repeats"))
            break
        n_open = sum(1 for a in wanted if set(a.targets) <= set(chosen))
        text = (f"decisions open: {len(wanted)}; round {k} measures {counted(len(chosen), 'cell')} again for "
                f"{n_open} of them")
        report(Progress(kind="note", group="", text=text))
        t0 = time.time()
        again = {cid: kept[cid].again(target, time_cap_s=cap) for cid, target in chosen.items()}
        planned = [Planned(spec=p.spec, reason=None) for p in again.values()]
        for i, g in enumerate(group(planned)):
            if time.time() + start_s > deadline:
                break
            report(Progress(kind="more", group=g.label, n=len(g.cells)))  # counted as each group starts
            report(Progress(kind="group", group=g.label, n=len(g.cells)))
            run_group(g, f"d{k}.{i}", ctx, again=again)
        done.append({"round": k, "cap_s": cap, "open": [a.pick.title
                                          for a in wanted],
                     "cells": {str(c): t for c, t in chosen.items()}, "seconds": round(time.time() - t0, 1)})
    return done
