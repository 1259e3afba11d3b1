"""The knob search of a budgeted run: after the screening pass, the variants of the leading strategies
(:mod:`bench.plan.search`) measured in three stages, every one an ordinary cell of the run folder.

1. Stage 0, brief: every runnable stage-0 configuration once, its timed steps capped so that the
   stage fits its share of the time left (:data:`STAGE0_SHARE`).
2. Stage 1: the compiled twins of each slot's ``keep`` fastest configurations, and those
   configurations once more beside them (the twins and what they are compared with measured in the
   same process groups, interleaved).
3. Final: the ``final`` fastest configurations of each slot and what its answer starts from
   (:func:`bench.decide.best.incumbent`) measured again, ``ROUND_REPEATS`` more at a time (3 at
   least, the fewest an interval from repeats needs), until the fastest and the runner-up are apart
   beyond the noise or the same speed, or the time is up; a round that cannot fit every slot's
   three measures every slot's fastest two first.

A candidate that does not fit the time left is never started: the search's record in meta.json
(``search``) names it, with every candidate the memory model or a strategy rejected, the knobs
searched, what each stage measured and how many minutes measuring every candidate would have taken.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from bench.core.settings import RunConfig
from bench.core.spec import CellSpec
from bench.decide import best
from bench.decide import picks as run_picks
from bench.decide.best import recipe
from bench.decide.decision import Verdict
from bench.decide.rules import judge_pair, launch_bound
from bench.plan import search as plan_search
from bench.plan.budget import COMPILE_S, _overhead
from bench.plan.matrix import Planned, group
from bench.plan.search import Candidate, Slot, Space
from bench.results.run import load_run
from bench.train.adaptive import Ask, ask_for, fit_every, launch_cost, repeat_parts, round_cap
from bench.train.adaptive import asks as adaptive_asks
from bench.train.context import GroupContext, Progress, RunPlan
from bench.train.group import run_group

#: the share of the search's time stage 0 may spend; stage 1 takes up to STAGE1_SHARE of what is left,
#: the final rounds the rest. On 2 CPU cores under the default 4-minute budget, 45% fits every slot's
#: 2x and 4x batch (the first two columns) with about 15% to spare either way, so a re-run measures
#: the same candidates
STAGE0_SHARE, STAGE1_SHARE = 0.45, 0.6
#: the shortest and longest timed-step cap a candidate's repeat gets (seconds)
MIN_CAP_S, MAX_CAP_S = 0.5, 5.0
#: final rounds at most
MAX_ROUNDS = 4


def enabled(cfg: RunConfig) -> bool:
    """Whether the run searches: ``search`` auto or wide, under a budget, on one node."""
    return cfg.budget.search != "off" and bool(cfg.budget.duration) and cfg.nodes.nnodes == 1


@dataclasses.dataclass(frozen=True)
class _Open:
    """An open final decision, as :class:`bench.train.adaptive.Ask` names it."""

    title: str
    launch_bound: bool


class Search:
    """One run's search: its candidates, what it measured, what it pruned and why."""

    def __init__(self, ctx: GroupContext, todo: RunPlan, end: float, decisions: bool = False,
                 until: float | None = None):
        self.ctx, self.cfg, self.end, self.decisions = ctx, ctx.cfg, end, decisions
        self.until = max(until or end, end)  # the final rounds' end
        self.space: Space = plan_search.SPACES["wide" if self.cfg.budget.search == "wide" else "auto"]
        self.screened = [p for p in todo.cells if p.reason is None]
        self.measure = self.screened[0].spec.measure if self.screened else None
        self.pruned: list[dict[str, Any]] = []
        self.stages: list[dict[str, Any]] = []
        self.gpus = todo.gpus

    # -- costs ----------------------------------------------------------------------------------
    def compile_s(self) -> float:
        """Seconds a compiled cell spends compiling: the most this run measured, else the budget's COMPILE_S."""
        cells = load_run(self.ctx.writer.dir).cells
        seen = cells["compile_s"].dropna() if "compile_s" in cells else []
        return float(max(seen)) if len(seen) else COMPILE_S[self.cfg.matrix.device]

    def cost(self, c: Candidate, cap: float, compile_s: float) -> float:
        """Seconds one repeat of candidate ``c`` takes: a measured cell of its strategy's (fixed part,
        timed part scaled by the batch, capped), else the budget's model; compiling on top."""
        s = c.spec
        like = sorted((p for p in self.ctx.kept.values() if p.spec.strategy == s.strategy
                       and p.spec.workload.name == s.workload.name and p.spec.n_devices == s.n_devices and p.repeats),
                      key=lambda p: p.spec.training.compile != s.training.compile)
        compiled = like[0].spec.training.compile == "on" if like else False  # its wall holds the compile
        if like:
            fixed, timed = repeat_parts(like[0])
            timed *= s.workload.global_batch / like[0].spec.workload.global_batch
        else:
            fixed, timed = _overhead(self.cfg, s), cap
        return fixed + min(timed, cap) + (compile_s if s.training.compile == "on" and not compiled else 0.0)

    # -- running --------------------------------------------------------------------------------
    def cells_of(self, cands: list[Candidate], cap: float) -> list[CellSpec]:
        m = dataclasses.replace(self.measure, repeats=1, time_cap_s=cap, profile_steps=0)
        return [dataclasses.replace(c.spec, measure=m) for c in cands]

    def measure_cells(self, tag: str, new: list[CellSpec], again: dict[int, Any], end: float | None = None) -> set[int]:
        """Run ``new`` cells and measure ``again`` ones once more, grouped by process group, each
        group started only before ``end`` (the stages' end by default); the ids of the new cells a
        group the time left could not start held."""
        ctx = self.ctx
        start_s = launch_cost(ctx.starts, self.cfg.matrix.device)
        planned = [Planned(spec=s, reason=None) for s in new] + [Planned(spec=p.spec, reason=None)
                                                                  for p in again.values()]
        cut: set[int] = set()
        for i, g in enumerate(group(planned)):
            if time.time() + start_s > (self.end if end is None else end):
                left = [c for c in g.cells if c.cell_id not in again]
                self.prune(left, "time: the search's time ran out before its process group")
                cut |= {c.cell_id for c in left}
                continue
            ctx.report(Progress(kind="more", group=g.label, n=len(g.cells)))
            ctx.report(Progress(kind="group", group=g.label, n=len(g.cells)))
            run_group(g, f"{tag}.{i}", ctx, again={k: v for k, v in again.items()
                                                  if k in {c.cell_id for c in g.cells}})
        return cut

    def prune(self, specs: list[CellSpec], why: str) -> None:
        for s in specs:
            self.pruned.append({"cell": plan_search.describe(s), "workload": s.workload.name, "backend": s.backend,
                                "world_size": s.n_devices, "why": why.split(":")[0], "reason": why})

    def stage(self, k: int, cands: list[Candidate], share: float, targets: dict[int, int] | None = None) -> None:
        """Measure the candidates of stage ``k`` that fit ``share`` of the time left, and the measured
        cells of ``targets`` up to their repeats there, with a cap that fits them; the candidates that
        do not fit pruned for time."""
        t0, left = time.time(), (self.end - time.time()) * share
        compile_s = self.compile_s()
        n = max(len(cands) + len(targets or {}), 1)
        fixed = sum(self.cost(c, 0.0, compile_s) for c in cands)
        cap = min(max((left / 1.25 - fixed) / n, MIN_CAP_S), self.measure.time_cap_s or MAX_CAP_S, MAX_CAP_S)
        run, rest = plan_search.afford(cands, left, lambda c: self.cost(c, cap, compile_s))
        self.prune([c.spec for c in rest], f"time: its column of candidates (every slot's variant of its rank, "
                                           f"{self.cost(rest[0], cap, compile_s):.0f} s this one) or an earlier "
                                           f"one did not fit the {left:.0f} s stage {k} had" if rest else "")
        if not run:
            targets = {}  # nothing new to measure them beside: the final rounds spend the time better
        again = {cid: self.ctx.kept[cid].again(t, time_cap_s=cap) for cid, t in (targets or {}).items()}
        cut: set[int] = set()
        if run or again:
            self.ctx.report(Progress(kind="note", group="", text=f"search stage {k}: {len(run)} configuration(s)"
                                                                 f" at {cap:.1f} s of timed steps each"))
            cut = self.measure_cells(f"s{k}", self.cells_of(run, cap), again or {})
        self.stages.append({"stage": k, "cells": [c.spec.cell_id for c in run if c.spec.cell_id not in cut],
                            "again": sorted(again or {}),
                            "cap_s": round(cap, 2), "seconds": round(time.time() - t0, 1)})

    def final(self, slots: list[Slot]) -> None:
        """Rounds of repeats for each slot's fastest configurations until their order is decided,
        and, in the same process groups, for the strategy decisions still open (``self.decisions``):
        a round of each kind would pay every launch twice."""
        ctx = self.ctx
        for k in range(1, MAX_ROUNDS + 1):
            run = load_run(ctx.writer.dir)
            # in the slots' own order (every slot's first judgement before any slot's second, real
            # workloads before launch-bound ones), not by cost: a time that fits only some of them
            # decides the same ones in a run and in its re-run
            decisions = self.decision_asks(run)
            wanted = self.asks(run, slots, decisions)
            if not wanted:
                return
            left, start_s = self.until - time.time(), launch_cost(ctx.starts, self.cfg.matrix.device)
            cap = round_cap(wanted, left, start_s, self.measure.time_cap_s or MAX_CAP_S)
            chosen = fit_every(wanted, self.asks(run, slots, decisions, 2), ctx.kept, left, start_s, cap)
            if not chosen:
                return
            t0 = time.time()
            again = {cid: ctx.kept[cid].again(t, time_cap_s=cap) for cid, t in chosen.items()}
            self.measure_cells(f"f{k}", [], again, self.until)
            self.stages.append({"stage": f"final {k}", "cells": [], "again": sorted(again), "cap_s": cap,
                                "seconds": round(time.time() - t0, 1)})

    def decision_asks(self, run) -> list[Ask]:
        """The open strategy decisions' asks (:func:`bench.train.adaptive.asks`, the search's cells
        aside), when the final rounds take them (``self.decisions``)."""
        if not self.decisions:
            return []
        return adaptive_asks(run_picks.decide(run, searched_ids=self.measured()), self.ctx.kept)

    def asks(self, run, slots: list[Slot], decisions: list[Ask], final: int | None = None) -> list[Ask]:
        """A final round's asks: each slot's (:meth:`ask`, between its ``final`` fastest) and the open
        strategy decisions' (``decisions``), in :func:`_order`."""
        out = [a for a in (self.ask(run.training, s, final) for s in slots) if a is not None]
        return sorted(out + decisions, key=_order)

    def measured(self) -> set[int]:
        """The ids of the cells the search's stages measured (its candidates and their references)."""
        return best.stage_cells(self.stages)

    def ask(self, cells, slot: Slot, final: int | None = None) -> Ask | None:
        """The repeats the slot's final decision between its ``final`` fastest configurations (the
        space's by default) still needs, or None when it is decided (or cannot be)."""
        ranked = best.ranked(cells, slot)
        top = ranked.head(final or self.space.final)
        # what the answer starts from too (best.incumbent): the answer's margin is read against it
        start = best.incumbent(ranked[ranked["cell_id"].isin({p.spec.cell_id for p in self.screened})])
        base = ranked.head(0) if start is None else ranked[ranked["cell_id"] == start["cell_id"]]
        rivals = [r for r in (top.iloc[1] if len(top) > 1 else None, base.iloc[0] if len(base) else None)
                  if r is not None and r["cell_id"] != top.iloc[0]["cell_id"]] if len(top) else []
        # Repeats are asked where a pair is open. A pair apart beyond the noise by a lead that does not
        # clear 3% at the edges (best.unsettled) is left as it is: more repeats seldom lift so small a
        # lead over the band, and they would take the final rounds' time from slots with no judgement.
        if not any(judge_pair(top.iloc[0], r).state == Verdict.OPEN for r in rivals):
            return None
        ids = list(dict.fromkeys([int(c) for c in top["cell_id"]] + [int(c) for c in base["cell_id"]]))
        return ask_for(_Open(f"{slot[0]} {slot[1]} x{slot[2]}", launch_bound(top.iloc[0])), ids, self.ctx.kept)

    def run(self) -> dict[str, Any]:
        cells = load_run(self.ctx.writer.dir)
        first_id = int(cells.cells["cell_id"].max()) + 1 if len(cells.cells) else 0
        leads = best.leaders(cells.training, self.space.leaders)
        cands = plan_search.plan(self.cfg, self.gpus, self.screened, leads, self.space, first_id)
        for c in cands:
            if c.reason is not None:
                self.prune([c.spec], ("memory: " if "out of memory" in c.reason else "rejected: ") + c.reason)
        self.stage(0, plan_search.first_pass(cands), STAGE0_SHARE)
        kept = self.ctx.kept
        measured = load_run(self.ctx.writer.dir).training
        slots = list(dict.fromkeys(c.slot for c in cands if not c.reference))
        fastest = {s: {int(i) for i in best.ranked(measured, s)["cell_id"].head(self.space.keep)}
                   for s in slots}
        promoted = plan_search.promoted(fastest, cands)
        twins_of = {c.twin for c in promoted if c.twin is not None}
        chosen = {c.spec.cell_id for c in promoted}
        self.prune([c.spec for c in cands if c.stage == 1 and not c.reference and c.reason is None
                    and c.spec.cell_id not in chosen],
                   f"ranked out: its stage-0 configuration was not among its slot's {self.space.keep} fastest")
        targets = {cid: len(kept[cid].repeats) + 1 for cid in twins_of if cid in kept and kept[cid].repeats}
        self.stage(1, [c for c in promoted if c.reason is None], STAGE1_SHARE, targets)
        self.final(slots)
        compile_s = self.compile_s()
        ran = {c.spec.cell_id: c.spec for c in cands} | {p.spec.cell_id: p.spec for p in self.screened}
        measured = self.measured() | {p.spec.cell_id for p in self.screened}
        return {"mode": self.cfg.budget.search, "knobs": self.space.knobs(), "candidates": len(cands),
                "slots": [f"{s[0]} {s[1]} x{s[2]}" for s in slots], "stages": self.stages, "pruned": self.pruned,
                "measured": sorted(self.measured()),
                "wider_minutes": plan_search.wider_minutes(cands, lambda c: self.cost(c, MAX_CAP_S, compile_s) * 3),
                "recipes": {str(i): recipe(ran[i]) for i in sorted(measured) if i in ran}}


def _order(a: Ask) -> tuple[bool, bool]:
    """A final round's order: asks whose cells reach their first 3 repeats (a first judgement)
    before those that add to 3 or more, real workloads before launch-bound ones."""
    return min(a.targets.values()) > 3, a.pick.launch_bound


def search(ctx: GroupContext, todo: RunPlan, end: float, decisions: bool = False,
           until: float | None = None) -> dict[str, Any]:
    """Run the search's stages until ``end`` and its final rounds until ``until`` (unix seconds;
    ``end`` without it); what it did, for meta.json. ``decisions``: the final rounds repeat the open
    strategy decisions' cells too (an adaptive run)."""
    if not any(p.reason is None for p in todo.cells):
        return {"mode": ctx.cfg.budget.search, "skipped": "nothing was screened"}
    return Search(ctx, todo, end, decisions, until).run()
