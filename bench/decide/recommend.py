"""The answer a reader came for: per workload, backend and world size, which strategy to use.

A candidate is a cell that ran (status ok: it also passed the distribution check), matched the
single-device run (parity ok) and trains the same model (not an ensemble of independent models).
The fastest candidate is the ``winner`` (a measured fact); what to ``use`` follows the rules of
:mod:`bench.decide.rules`, in this order:

1. no decision, with the reason, when the single-device reference or a leading candidate is
   unstable in one run or contended, or an efficiency is not physical;
2. one device when every candidate is slower than it, or none is faster beyond the noise by more
   than ``EQUIVALENT``;
3. the library default (DDP; FSDP when the model does not fit one device or DDP ran out of memory)
   unless another candidate is faster beyond the noise by more than ``EQUIVALENT``, and then that one, with what in its
   breakdown makes it faster; a model that does not fit one device says so, with the memory
   headroom of what to use.

Each decision rests on pairs of cells (the fastest against one device, and against the library
default or the runner-up), judged from throughput intervals by :func:`bench.decide.rules.judge_pair`:
one is faster beyond the noise, the two are the same speed (both intervals within ``EQUIVALENT``, or
separated with medians within it), or the pair is
open (the intervals overlap more than that, or one comes from a single run). A decision is
``resolved`` when none of its pairs is open; an open one names its cells (``open_cells``: what the
run's adaptive repeats measure again) and about how many repeats a cell would close it
(``repeats_needed``), and what it points to stands until they do. When nothing scales,
``next_step`` says what to try. ``launch_bound`` marks picks of a workload whose step measures
launches more than the strategy.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from bench.core import knobs
from bench.core.text import gap_text, lead
from bench.decide.rules import (
    BUBBLE_BOUND,
    COMM_BOUND,
    EQUIVALENT,
    GROSS_APART,
    GROSS_SPEEDUP,
    IDLE_BOUND,
    MEMORY_BOUND,
    PairVerdict,
    blockers,
    breakdown_off,
    capacity_from,
    faster_because,
    from_repeats,
    headroom,
    is_false,
    judge_pair,
    launch_bound,
    library_default,
    next_step,
    num,
    overlap,
    ran_out,
    rebuild_off,
    text,
)
from bench.results.derived import derive, parity_failure

__all__ = ["Pick", "candidates", "first_screen", "is_false", "reason", "recommend"]



@dataclass(frozen=True, kw_only=True)
class Pick:
    workload: str
    backend: str
    world_size: int
    winner: str  # the fastest candidate
    step_ms: float  # the winner's median step
    runner_up: str | None
    margin: float | None  # runner-up step / winner step - 1
    significant: bool | None  # winner vs runner-up beyond the noise (None: not judged)
    same_speed: bool = False  # winner and runner-up within EQUIVALENT of each other (judge_pair)
    why: str  # what bounds the winner's step
    candidates: int
    excluded: str  # what was left out and why
    speedup: float | None = None  # winner's throughput against the single-device cell of the same workload
    use: str | None = None  # what the rules point to ("single": one device); None: no decision
    decision: str = ""  # undecided | one-device | library | faster | fastest
    resolved: bool = False  # the decision rests on intervals from repeats and nothing blocks it
    because: str = ""  # why ``use`` (or why no decision)
    next_step: str = ""  # what to try when nothing scales
    launch_bound: bool = False  # the workload's step measures launches more than the strategy
    fits_one_device: bool | None = None  # False: the single-device cell ran out of memory
    headroom: float | None = None  # free share of the device at the peak of ``use``
    open_cells: tuple[int, ...] = ()  # cells an unresolved decision needs measured again
    repeats_needed: int | None = None  # about how many repeats a cell would resolve it (None: not known)
    minutes_needed: float | None = None  # about how long those repeats take, from the cells' own repeats
    training: str = ""  # the group's values of the knobs the run varies ('compile=on'; '' for none)

    def line(self) -> str:
        """The pick as one line of plain text: a decision says "use", one still open says "not
        decided" and what would decide it, no decision says why."""
        head = "use" if self.resolved else f"not decided ({self.open_text()}):"
        if self.decision == "undecided":
            body = f"no decision: {self.because}; fastest: {self.winner} ({self._numbers()})"
        elif self.decision == "one-device":
            body = f"use one device; {self.because}" if self.resolved else f"{head} one device leads; {self.because}"
        elif self.use == self.winner:
            body = f"{head} {self.use} {'leads ' if not self.resolved else ''}({self._numbers()}); {self.because}"
        else:
            body = f"{head} {self.use}, the library default; {self.because}"
        tail = [self.why] + ([self.next_step] if self.next_step else [])
        return f"{self.title}: {body}; " + "; ".join(tail) + \
            (f" [{self.excluded}]" if self.excluded else "")

    @property
    def title(self) -> str:
        """'gpt-tiny, gloo x2' (and the knobs the run varies: 'gpt-tiny, gloo x2, compile=on')."""
        return f"{self.workload}, {self.backend} x{self.world_size}" + (f", {self.training}" if self.training else "")

    def open_text(self) -> str:
        """What would resolve an open decision, in a few words."""
        if self.repeats_needed is None:
            return "more repeats would not separate them" if self.open_cells else "nothing to repeat"
        took = f", ~{self.minutes_needed:.0f} min" if self.minutes_needed is not None and self.minutes_needed >= 1 \
            else (", under a minute" if self.minutes_needed is not None else "")
        return f"needs about {self.repeats_needed} repeats a cell{took}"

    def _numbers(self) -> str:
        out = f"{self.step_ms:.1f} ms/step"
        if self.speedup is not None:
            out += f", {self.speedup:.2f}x one device" if self.speedup >= 1 else \
                f", slower than one device: {self.speedup:.2f}x"
        return out


def candidates(cells: pd.DataFrame) -> tuple[pd.DataFrame, pd.Series]:
    """(cells that qualify, reason per excluded ran-ok cell)."""
    ok = cells[cells["status"] == "ok"]
    why = pd.Series("", index=ok.index, dtype="object")
    if "role" in ok:
        why[ok["role"] == "independent"] = "trains independent models"
    if "parity_ok" in ok:
        par = ok["parity_ok"]
        failed = (why == "") & (par == False)  # noqa: E712 - pandas boolean
        why[failed] = [parity_failure(r) for _, r in ok[failed].iterrows()]
        # Never checked is not passed: no reference, or no losses to compare (one device is its own),
        # unless no device could hold the model: then nothing can check it, and the cells that fit
        # are the answer.
        unchecked = (why == "") & par.isna() & (ok["world_size"] > 1) & ~_beyond_one_device(cells, ok)
        why[unchecked] = "parity not checked (no single-device reference)"
    return ok[why == ""], why[why != ""]


def is_reference(cells: pd.DataFrame) -> pd.Series:
    """The single-device reference cells (strategy single, or a cell in the reference role)."""
    ref = cells["strategy"] == "single"
    return ref | (cells["role"] == "reference") if "role" in cells else ref


def _beyond_one_device(cells: pd.DataFrame, ok: pd.DataFrame) -> pd.Series:
    """Which of ``ok`` train a workload (at its global batch) whose single-device reference ran out
    of memory or could not fit."""
    refs = cells[is_reference(cells) & (cells["world_size"] == 1)]
    refs = refs[ran_out(refs)]
    keys = ["workload", "global_batch"] if "global_batch" in cells else ["workload"]
    gone = set(map(tuple, refs[keys].astype(str).to_numpy()))
    return pd.Series([tuple(k) in gone for k in ok[keys].astype(str).to_numpy()], index=ok.index, dtype=bool)


def reason(r: pd.Series, gpu_mem: float | None = None) -> str:
    """One line of why a cell's step takes what it takes, from its measurements."""
    parts = []
    exposed, compute, idle = r.get("exposed_comm_s"), r.get("compute_time_s"), r.get("idle_frac")
    # A breakdown whose profiled step is far from the timed one describes another step: none of its
    # shares says what bounds the timed step (the bubble, from the timed step, and memory still do).
    off = breakdown_off(r)
    if off is not None:
        exposed = compute = idle = None
    # Fractions of the profiled step (the breakdown's own step), never of the timed one: the
    # profiler stretches a step, and a share above 100% would be nonsense.
    span = r.get("profiled_step_s")
    if (span is None or pd.isna(span)) and all(pd.notna(v) for v in (exposed, compute, idle)) and idle < 1:
        span = (compute + exposed) / (1 - idle)
    if pd.notna(exposed) and span is not None and pd.notna(span) and span > 0 and exposed / span >= COMM_BOUND:
        parts.append(f"communication-bound ({exposed / span:.0%} of the step is exposed communication)")
    bubble = r.get("bubble_measured")
    if pd.notna(bubble) and bubble >= BUBBLE_BOUND:
        parts.append(f"pipeline bubble {bubble:.0%}")
    mem = r.get("peak_mem_bytes")
    if gpu_mem and pd.notna(mem) and mem / gpu_mem >= MEMORY_BOUND:
        parts.append(f"memory-bound ({mem / gpu_mem:.0%} of the GPU)")
    if not parts and pd.notna(idle) and idle >= IDLE_BOUND:
        parts.append(f"launch-bound ({idle:.0%} of the step the device is idle)")
    if not parts and off is not None:
        moved = rebuild_off(r)
        parts.append(f"bound not known (its profiled step is {gap_text(off)} off the timed one" + (
            f"; built again for profiling it ran {gap_text(moved)} off unprofiled: its step moves from build "
            "to build)" if moved is not None else ")"))
    elif not parts and (compute is None or pd.isna(compute)):
        # no breakdown (profiling off, or the profile pass failed or was cut): no bound is claimed
        note = r.get("profile_note")
        parts.append("bound not known (no breakdown" + (f": {note})" if isinstance(note, str) and note else ")"))
    elif not parts:
        mfu = r.get("mfu")
        parts.append(f"compute-bound (MFU {mfu:.0%})" if pd.notna(mfu) else "compute-bound")
    if is_false(r.get("stable")):
        parts.append(f"noisy: {r.get('noise')}")
    note = r.get("scaling_note")
    if note is not None and not pd.isna(note):
        parts.append(f"scaling: {note}")
    return "; ".join(parts)


def _with_scaling_notes(cells: pd.DataFrame) -> pd.DataFrame:
    """Cells with the run's scaling efficiency and note, derived here when the table lacks them
    (a compact evidence table keeps only the measured columns)."""
    need = {"cell_id", "workload", "device", "precision", "status", "world_size", "throughput_samples_s"}
    if "scaling_note" in cells or not need <= set(cells.columns):
        return cells
    d = derive(cells, pd.DataFrame())
    return cells.assign(scaling_efficiency=d["scaling_efficiency"], scaling_note=d["scaling_note"])


def _ids(rows: list[pd.Series]) -> tuple[int, ...]:
    """The cell ids of ``rows`` (those that have one), each once."""
    return tuple(dict.fromkeys(int(r["cell_id"]) for r in rows if r is not None and pd.notna(r.get("cell_id"))))


def _with_open(out: dict, rows: list[pd.Series], v: PairVerdict) -> dict:
    """``out`` made unresolved by an open pair: its cells join the ones to measure again, and the
    repeats it needs (None: more than repeats can give) join the largest need so far."""
    need = out.get("repeats_needed", 0)
    more = None if v.need is None or need is None else max(need, v.need)
    return {**out, "resolved": False, "open_cells": tuple(dict.fromkeys((*out.get("open_cells", ()), *_ids(rows)))),
            "repeats_needed": more}


def _priced(cells: pd.DataFrame, out: dict) -> dict:
    """``out`` with ``minutes_needed``: the repeats an open decision needs, each at what a timed
    repeat of its cell took (wall time less the profiled steps, over its repeats)."""
    need, ids = out.get("repeats_needed"), out.get("open_cells") or ()
    if need is None or not ids or not {"cell_id", "cell_wall_s", "repeats_done"} <= set(cells.columns):
        return out
    total = 0.0
    for cid in ids:
        r = cells[cells["cell_id"] == cid]
        if r.empty:
            return out
        r = r.iloc[0]
        n, wall, prof = num(r.get("repeats_done")), num(r.get("cell_wall_s")), num(r.get("profile_s")) or 0.0
        if not n or wall is None:
            return out
        total += max(need - n, 0) * (wall - prof) / n
    return {**out, "minutes_needed": total / 60}


class Group:
    """The candidates of one workload, backend and world size, and the decision about them."""

    def __init__(self, cells: pd.DataFrame, g: pd.DataFrame, gpu_mem: float | None):
        self.cells, self.g = cells, g.sort_values("step_time_median_s")
        self.best = self.g.iloc[0]
        self.wl, self.be, self.ws = self.best["workload"], self.best["backend"], int(self.best["world_size"])
        self.knobs = {k: self.best[k] for k in knobs.NAMES if k in self.best and pd.notna(self.best[k])}
        self.ref, self.oom = self._reference()
        self.gpu_mem = gpu_mem or (capacity_from(self.oom["reason"]) if self.oom is not None else None)
        here = self.trained_alike(cells[(cells["workload"] == self.wl) & (cells["backend"] == self.be)
                                        & (cells["world_size"] == self.ws)])
        self.oom_here = here[ran_out(here)]
        sharding = self.oom is not None or (self.oom_here["strategy"] == "ddp").any()
        self.default = library_default(self.g, sharding)

    def trained_alike(self, cells: pd.DataFrame) -> pd.DataFrame:
        """The rows of ``cells`` trained with this group's training knobs."""
        for k, v in self.knobs.items():
            if k in cells:
                cells = cells[cells[k] == v]
        return cells

    def _reference(self) -> tuple[pd.Series | None, pd.Series | None]:
        """(the single-device cell that ran, or the one that ran out of memory) of the same workload
        and batch: the same global batch (strong scaling) or batch per device (weak)."""
        c = self.cells
        same = self.trained_alike(c[is_reference(c) & (c["workload"] == self.wl) & (c["world_size"] == 1)])
        gb = num(self.best.get("global_batch"))
        if gb is not None and "global_batch" in c:
            weak = text(self.best.get("scaling")) == "weak"
            same = same[same["global_batch"] == (gb // self.ws if weak else gb)]
        for col in ("device", "precision"):
            if col in c and pd.notna(self.best.get(col)):
                same = same[same[col] == self.best[col]]
        ran = same[same["status"] == "ok"]
        oom = same[ran_out(same)]
        return (ran.iloc[0] if len(ran) else None), (oom.iloc[0] if len(oom) else None)

    def speedup(self, r: pd.Series) -> float | None:
        """Throughput against the single-device cell."""
        if self.ref is None:
            return None
        a, b = num(r.get("throughput_samples_s")), num(self.ref.get("throughput_samples_s"))
        return a / b if a is not None and b else None

    def rival(self) -> pd.Series | None:
        """What the fastest is weighed against: the library default, else the runner-up."""
        if self.default is not None and self.default.name != self.best.name:
            return self.default
        return self.g.iloc[1] if len(self.g) > 1 else None

    def decide(self) -> dict:
        """use, decision, resolved, because, the cells an open decision needs measured again and
        about how many repeats a cell would close it (and, where it applies, fits_one_device, headroom)."""
        rival = self.rival()
        rows = ([("one device", self.ref)] if self.ref is not None else []) + [(str(self.best["strategy"]), self.best)]
        # The rival counts when the pick rests on beating it; a runner-up behind the library default
        # cannot overturn it (an unstable one only widens its own interval).
        if rival is not None and (self.default is None or rival.name == self.default.name):
            rows.append((str(rival["strategy"]), rival))
        block = blockers(rows, {k: self.speedup(r) for k, r in rows if r is not self.ref}, self.ws)
        gross = self._gross_one_device(block)
        if gross is not None:
            return gross
        if block:
            # repeats can lift one kind of block: an unstable cell measured in one run
            again = [r for _, r in rows if is_false(r.get("stable")) and not from_repeats(r)]
            return dict(use=None, decision="undecided", resolved=False, because="; ".join(block),
                        open_cells=_ids(again), repeats_needed=3 if again else None)
        s = self.speedup(self.best)  # None without a reference
        vs_ref = judge_pair(self.best, self.ref) if self.ref is not None else None
        # one device unless a candidate is faster (an open pair with a faster median leads, unresolved)
        if s is not None and vs_ref is not None and (s < 1 or vs_ref.state in ("b", "same")):
            return self._one_device(s, vs_ref)
        out = self._strategy(rival)
        if vs_ref is not None and vs_ref.state == "open":  # using it at all rests on beating one device
            out = _with_open(out, [self.best, self.ref], vs_ref)
        if self.oom is not None:
            used = self.g.loc[self.g["strategy"] == out["use"]].iloc[0]
            free, words = headroom(used, self.gpu_mem)
            # No device ran the whole model, so nothing checked the strategy's losses against it.
            unchecked = "; parity not checked (no device ran the whole model)" if pd.isna(used.get("parity_ok")) else ""
            out.update(fits_one_device=False, headroom=free,
                       because=f"does not fit one device (single: out of memory); {words}{unchecked}; "
                               f"{out['because']}")
        return out

    def _gross_one_device(self, block: list[str]) -> dict | None:
        """One device, decided by a margin no noise explains (GROSS_SPEEDUP, GROSS_APART), even where
        the cells are noisy or contended (``block``) and the finer ranking stays open; None otherwise."""
        if self.ref is None or bool(text(self.best.get("contended"))) != bool(text(self.ref.get("contended"))):
            return None  # one side slowed by the machine: not a gap to decide on
        s = self.speedup(self.best)
        lo, hi = num(self.best.get("step_time_ci_low_s")), num(self.ref.get("step_time_ci_high_s"))
        gb_best, gb_ref = num(self.best.get("global_batch")), num(self.ref.get("global_batch"))
        if s is None or s > GROSS_SPEEDUP or not lo or not hi:
            return None
        # in throughput (weak scaling trains more samples a step): even one device's slowest beats
        # the candidate's fastest by GROSS_APART
        per = gb_best / gb_ref if gb_best and gb_ref else 1.0
        if lo < GROSS_APART * hi * per:
            return None
        once = "" if from_repeats(self.best) and from_repeats(self.ref) else " (one run a cell)"
        because = (f"every candidate is slower than one device, by at least {1 / s:.1f}x: the best, "
                   f"{self.best['strategy']}, reaches {s:.2f}x{once}, a gap no noise of this run explains")
        return dict(use="single", decision="one-device", resolved=True,
                    because=because + (f" (the finer ranking is open: {'; '.join(block)})" if block else ""))

    def _one_device(self, s: float, v: PairVerdict) -> dict:
        """One device: every candidate is slower, or none is faster beyond the noise by more than
        EQUIVALENT."""
        best = self.best["strategy"]
        if s < 1:
            because = f"every candidate is slower than one device: the best, {best}, reaches {s:.2f}x"
        elif v.state == "same":
            because = f"no candidate is faster than one device: the best, {best}, reaches {s:.2f}x, within " \
                      f"{EQUIVALENT:.0%}"
        else:
            because = f"no candidate is faster than one device beyond the noise: the best, {best}, reaches {s:.2f}x"
        out = dict(use="single", decision="one-device", resolved=True, because=because)
        return _with_open(out, [self.ref, self.best], v) if v.state == "open" else out

    def _strategy(self, rival: pd.Series | None) -> dict:
        best, name = self.best, str(self.best["strategy"])
        if rival is None:
            out = dict(use=name, decision="library" if self.default is not None else "fastest",
                       resolved=from_repeats(best), because="the only strategy that passed")
            return out if from_repeats(best) else {**out, "open_cells": _ids([best]), "repeats_needed": 3}
        margin = rival["step_time_median_s"] / best["step_time_median_s"] - 1
        other, v = str(rival["strategy"]), judge_pair(best, rival)
        vs = {"a": "beyond the noise", "same": f"within {EQUIVALENT:.0%}, the same speed",
              "b": "within the noise", "open": "within the noise" if from_repeats(best) and from_repeats(rival)
              else "in one run"}[v.state]
        if self.default is None or self.default.name == best.name:
            kind = "the library default" if self.default is not None else "the fastest (no library default ran)"
            out = dict(use=name, decision="library" if self.default is not None else "fastest", resolved=True,
                       because=f"{kind}, {lead(margin)} ahead of {other} {vs}")
            return _with_open(out, [best, rival], v) if v.state == "open" else out
        why = faster_because(best, rival)
        if v.state == "a":
            return dict(use=name, decision="faster", resolved=True,
                        because=f"{lead(margin)} faster than {other} (library default) beyond the noise: {why}")
        out = dict(use=other, decision="library", resolved=True,
                   because=f"{name} leads it by {lead(margin)} {vs}" + (f" ({why})" if v.state == "open" else "")
                   + ("; it stands until repeats say otherwise" if v.state == "open" else ""))
        return _with_open(out, [best, rival], v) if v.state == "open" else out

    def excluded(self, why: pd.Series) -> str:
        """What of this group was left out, and why: candidates that did not qualify, cells that ran
        out of memory."""
        left = self.cells.loc[why.index]
        left = self.trained_alike(left[(left["workload"] == self.wl) & (left["backend"] == self.be)
                                       & (left["world_size"] == self.ws)])
        notes = [f"{r.strategy}: {why[i]}" for i, r in left.iterrows()]
        notes += [f"{s}: out of memory" for s in self.oom_here["strategy"]]
        return "; ".join(notes)


def recommend(cells: pd.DataFrame, gpu_mem: float | None = None) -> list[Pick]:
    """One pick per (workload, backend, world size >= 2) that has a candidate."""
    cells = _with_scaling_notes(cells)
    good, excluded = candidates(cells)
    by = ["workload", "backend", "world_size", *(k for k in knobs.NAMES if k in good)]
    groups = [Group(cells, g, gpu_mem) for _, g in good[good["world_size"] >= 2].groupby(by, sort=True, dropna=False)]
    vary = knobs.varying(good)  # a pick names the knobs the run compared
    best_speed = {(gr.wl, gr.be, gr.ws, knobs.short(gr.knobs, vary)): gr.speedup(gr.best) for gr in groups}
    out = []
    for gr in groups:
        win = gr.best
        runner, margin, sig, same = None, None, None, False
        if len(gr.g) > 1:
            second = gr.g.iloc[1]
            margin = float(second["step_time_median_s"] / win["step_time_median_s"] - 1)
            ov = overlap(win, second)
            judged = from_repeats(win) and from_repeats(second)
            runner, sig = str(second["strategy"]), (None if (ov is None or not judged) else not ov)
            same = judge_pair(win, second).state == "same"
        speed = gr.speedup(win)
        elsewhere = {(be, ws): s for (wl, be, ws, tr), s in best_speed.items()
                     if wl == gr.wl and tr == knobs.short(gr.knobs, vary) and s is not None}
        out.append(Pick(
            workload=str(gr.wl), backend=str(gr.be), world_size=gr.ws, training=knobs.short(gr.knobs, vary),
            winner=str(win["strategy"]),
            step_ms=float(win["step_time_median_s"]) * 1e3, runner_up=runner, margin=margin, significant=sig,
            same_speed=same, why=reason(win, gr.gpu_mem), candidates=len(gr.g), excluded=gr.excluded(excluded),
            speedup=speed,
            next_step=next_step(win, backend=str(gr.be), ws=gr.ws, speedup=speed, elsewhere=elsewhere),
            launch_bound=launch_bound(gr.ref if gr.ref is not None else win), **_priced(cells, gr.decide())))
    return out


def first_screen(picks: list[Pick]) -> list[Pick]:
    """Picks in the order the first screen shows them: real-model picks before launch-bound ones;
    within each, resolved decisions, then leading ones, then those without a decision."""
    return sorted(picks, key=lambda p: (p.launch_bound, not p.resolved, p.use is None))
