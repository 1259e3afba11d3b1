"""The answer a reader came for: per workload, backend and world size, which strategy to use.

A candidate is a cell that ran (status ok: it also passed the distribution check), matched the
single-device run (parity ok) and trains the same model (not an ensemble of independent models).
The fastest candidate is the ``winner`` (a measured fact); what to ``use`` follows the rules of
:mod:`bench.decide.rules`, in this order:

1. no decision, with the reason, when the single-device reference or a leading candidate is
   unstable in one run or contended, or an efficiency is not physical;
2. one device when every candidate is slower than it, or none is faster beyond the noise by more
   than ``EQUIVALENT``;
3. the library default (the strategy declared ``default_for="fits"``, DDP; the one declared for
   ``"sharded"``, FSDP, when the model does not fit one device or the first ran out of memory)
   unless another candidate is faster beyond the noise by more than ``EQUIVALENT``, and then that
   one, with what in its breakdown makes it faster; a model that does not fit one device says so,
   with the memory headroom of what to use.

Each decision rests on pairs of cells (the fastest against one device, and against the library
default or the runner-up), judged from throughput intervals by :func:`bench.decide.rules.judge_pair`:
one is faster beyond the noise, the two are the same speed (both intervals within ``EQUIVALENT``, or
separated with medians within it), or the pair is
open (the intervals overlap more than that, or one comes from a single run). A decision is
``resolved`` when none of its pairs is open (or when the open pair is :func:`inseparable`: a
lead under ``EQUIVALENT`` that repeats here would not show keeps one device, or the library
default, as rules 2 and 3 say); an open one names its
cells (``open_cells``: what the run's adaptive repeats measure again) and about how many repeats a cell would close it
(``repeats_needed``), and what it points to stands until they do. When nothing scales, its
``tips`` say what to try. ``launch_bound`` marks decisions of a workload whose step measures
launches more than the strategy. Each is a :class:`bench.decide.decision.Decision`, its evidence
as data; :mod:`reports.words` says it in sentences.
"""

from __future__ import annotations

import pandas as pd

from bench.core import knobs
from bench.decide.decision import (
    Against,
    Decision,
    DecisionKind,
    Excluded,
    ExcludedKind,
    Ground,
    Pair,
    Verdict,
)
from bench.decide.fits import nowhere, used_fit
from bench.decide.rules import (
    EQUIVALENT,
    GROSS_APART,
    GROSS_SPEEDUP,
    PairVerdict,
    blockers,
    bounds,
    capacity_from,
    declared,
    from_repeats,
    is_false,
    is_reference,
    judge_pair,
    launch_bound,
    lead_reasons,
    library_default,
    num,
    overlap,
    ran_out,
    text,
    tips,
)
from bench.results.derived import derive, parity_failure

__all__ = ["Decision", "candidates", "first_screen", "is_false", "is_reference", "recommend"]


def candidates(cells: pd.DataFrame) -> tuple[pd.DataFrame, pd.Series]:
    """(cells that qualify, an :class:`Excluded` per excluded ran-ok cell)."""
    ok = cells[cells["status"] == "ok"]
    why = pd.Series(None, index=ok.index, dtype="object")
    if "role" in ok:
        for i in ok.index[ok["role"] == "independent"]:
            why[i] = Excluded(strategy=str(ok.at[i, "strategy"]), kind=ExcludedKind.INDEPENDENT)
    if "parity_ok" in ok:
        par = ok["parity_ok"]
        failed = why.isna() & (par == False)  # noqa: E712 - pandas boolean
        for i, r in ok[failed].iterrows():
            why[i] = Excluded(strategy=str(r["strategy"]), kind=ExcludedKind.PARITY_FAILED, detail=parity_failure(r))
        # Never checked is not passed: no reference, or no losses to compare (one device is its own),
        # unless no device could hold the model: then nothing can check it, and the cells that fit
        # are the answer.
        unchecked = why.isna() & par.isna() & (ok["world_size"] > 1) & ~_beyond_one_device(cells, ok)
        for i in ok.index[unchecked]:
            why[i] = Excluded(strategy=str(ok.at[i, "strategy"]), kind=ExcludedKind.PARITY_UNCHECKED)
    return ok[why.isna()], why[why.notna()]


def _beyond_one_device(cells: pd.DataFrame, ok: pd.DataFrame) -> pd.Series:
    """Which of ``ok`` train a workload (at its global batch) whose single-device reference ran out
    of memory or could not fit."""
    refs = cells[is_reference(cells) & (cells["world_size"] == 1)]
    refs = refs[ran_out(refs)]
    keys = ["workload", "global_batch"] if "global_batch" in cells else ["workload"]
    gone = set(map(tuple, refs[keys].astype(str).to_numpy()))
    return pd.Series([tuple(k) in gone for k in ok[keys].astype(str).to_numpy()], index=ok.index, dtype=bool)


def _with_scaling_notes(cells: pd.DataFrame) -> pd.DataFrame:
    """Cells with the run's scaling efficiency, note and flag, derived here when the table lacks
    the flag (a compact evidence table keeps only the measured columns)."""
    need = {"cell_id", "workload", "device", "precision", "status", "world_size", "throughput_samples_s"}
    if "scaling_unphysical" in cells or not need <= set(cells.columns):
        return cells
    d = derive(cells, pd.DataFrame())
    return cells.assign(scaling_efficiency=d["scaling_efficiency"], scaling_note=d["scaling_note"],
                        scaling_unphysical=d["scaling_unphysical"])


def _ids(rows: list[pd.Series]) -> tuple[int, ...]:
    """The cell ids of ``rows`` (those that have one), each once."""
    return tuple(dict.fromkeys(int(r["cell_id"]) for r in rows if r is not None and pd.notna(r.get("cell_id"))))


def _cell(r: pd.Series) -> int | None:
    cid = num(r.get("cell_id"))
    return None if cid is None else int(cid)


def _pair(against: Against, a: pd.Series, b: pd.Series, v: PairVerdict | None = None) -> Pair:
    """The pair of ``a`` (the fastest) and ``b`` as judged (``v``; judged here when not given)."""
    v = v or judge_pair(a, b)
    sa, sb = num(a.get("step_time_median_s")), num(b.get("step_time_median_s"))
    repeated = from_repeats(a) and from_repeats(b)
    ov = overlap(a, b)
    return Pair(against=against, a=_cell(a), b=_cell(b), a_strategy=text(a.get("strategy")),
                b_strategy=text(b.get("strategy")), verdict=v.state,
                lead=sb / sa - 1 if sa and sb is not None else None, need=v.need, repeated=repeated,
                apart=None if ov is None or not repeated else not ov)


def inseparable(a: pd.Series, b: pd.Series, v: PairVerdict) -> bool:
    """An open pair that more repeats here would not close (past MAX_REPEATS, both already from
    repeats) and whose medians lie within EQUIVALENT: a lead no practitioner would switch for,
    which this machine's noise could not show even if it were real."""
    ta, tb = num(a.get("throughput_samples_s")), num(b.get("throughput_samples_s"))
    return (v.state == Verdict.OPEN and v.need is None and from_repeats(a) and from_repeats(b)
            and bool(ta) and bool(tb) and max(ta, tb) / min(ta, tb) - 1 <= EQUIVALENT)


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
        fits_default = any(declared(s, "default_for") == "fits" for s in self.oom_here["strategy"])
        self.default = library_default(self.g, self.oom is not None or fits_default)

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
        self.ref_tried = len(same) > 0
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
        """The decision's kind, ground, use, resolved, pairs and blockers, the cells an open decision
        needs measured again and about how many repeats a cell would close it (and, where the model
        does not fit one device, its fit)."""
        rival = self.rival()
        rows = ([(self.ref, True)] if self.ref is not None else []) + [(self.best, False)]
        # The rival counts when the pick rests on beating it; a runner-up behind the library default
        # cannot overturn it (an unstable one only widens its own interval).
        if rival is not None and (self.default is None or rival.name == self.default.name):
            rows.append((rival, False))
        block = tuple(blockers([(r, ref, None if ref else self.speedup(r)) for r, ref in rows], self.ws))
        gross = self._gross_one_device(block)
        if gross is not None:
            return gross
        if block:
            # repeats can lift one kind of block: an unstable cell measured in one run
            again = [r for r, _ in rows if is_false(r.get("stable")) and not from_repeats(r)]
            return dict(kind=DecisionKind.UNDECIDED, ground=Ground.BLOCKED, blockers=block, resolved=False,
                        open_cells=_ids(again), repeats_needed=3 if again else None)
        s = self.speedup(self.best)  # None without a reference
        vs_ref = judge_pair(self.best, self.ref) if self.ref is not None else None
        # one device unless a candidate is faster (an open pair with a faster median leads, unresolved)
        if s is not None and vs_ref is not None and (s < 1 or vs_ref.state in (Verdict.B, Verdict.SAME)
                                                     or inseparable(self.best, self.ref, vs_ref)):
            return self._one_device(s, vs_ref)
        out = self._strategy(rival)
        if vs_ref is not None:
            out["pairs"] = (_pair(Against.ONE_DEVICE, self.best, self.ref, vs_ref), *out.get("pairs", ()))
            if vs_ref.state == Verdict.OPEN:  # using it at all rests on beating one device
                out = _with_open(out, [self.best, self.ref], vs_ref)
        if self.oom is not None:
            out["fit"] = used_fit(self.g.loc[self.g["strategy"] == out["use"]].iloc[0], self.oom, self.gpu_mem)
        return out

    def _gross_one_device(self, block: tuple) -> dict | None:
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
        pair = _pair(Against.ONE_DEVICE, self.best, self.ref, PairVerdict(Verdict.B))
        return dict(kind=DecisionKind.ONE_DEVICE, ground=Ground.GROSS, use=text(self.ref.get("strategy")),
                    resolved=True, blockers=block, pairs=(pair,))

    def _one_device(self, s: float, v: PairVerdict) -> dict:
        """One device: every candidate is slower, or none is faster beyond the noise by more than
        EQUIVALENT (decided where the pair is open but :func:`inseparable`)."""
        ground = Ground.SLOWER if s < 1 else Ground.SAME_AS_ONE if v.state == Verdict.SAME else \
            Ground.NOT_BEYOND_NOISE
        out = dict(kind=DecisionKind.ONE_DEVICE, ground=ground, use=text(self.ref.get("strategy")), resolved=True,
                   pairs=(_pair(Against.ONE_DEVICE, self.best, self.ref, v),))
        if v.state == Verdict.OPEN and not inseparable(self.best, self.ref, v):
            return _with_open(out, [self.ref, self.best], v)
        return out

    def _strategy(self, rival: pd.Series | None) -> dict:
        best, name = self.best, str(self.best["strategy"])
        library = DecisionKind.LIBRARY if self.default is not None else DecisionKind.FASTEST
        if rival is None:
            out = dict(use=name, kind=library, ground=Ground.ONLY, resolved=from_repeats(best))
            return out if from_repeats(best) else {**out, "open_cells": _ids([best]), "repeats_needed": 3}
        v = judge_pair(best, rival)
        pairs = (_pair(Against.RIVAL, best, rival, v),)
        if self.default is None or self.default.name == best.name:
            out = dict(use=name, kind=library, ground=Ground.AHEAD, resolved=True, pairs=pairs)
            if library == DecisionKind.LIBRARY and from_repeats(best):
                return out  # rule 3: the default unless another is faster beyond the noise, and it leads them all
        elif v.state == Verdict.A:
            return dict(use=name, kind=DecisionKind.FASTER, ground=Ground.FASTER, resolved=True, pairs=pairs,
                        reasons=tuple(lead_reasons(best, rival)))
        else:
            why = tuple(lead_reasons(best, rival)) if v.state == Verdict.OPEN else ()
            out = dict(use=str(rival["strategy"]), kind=DecisionKind.LIBRARY, ground=Ground.DEFAULT_STANDS,
                       resolved=True, pairs=pairs, reasons=why)
            if v.state == Verdict.OPEN and inseparable(best, rival, v):
                return out  # the default stands: nothing here could show it beaten by a margin that matters
        return _with_open(out, [best, rival], v) if v.state == Verdict.OPEN else out

    def excluded(self, why: pd.Series) -> tuple[Excluded, ...]:
        """What of this group was left out, and why: candidates that did not qualify, cells that ran
        out of memory."""
        left = self.cells.loc[why.index]
        left = self.trained_alike(left[(left["workload"] == self.wl) & (left["backend"] == self.be)
                                       & (left["world_size"] == self.ws)])
        return tuple([why[i] for i in left.index]
                     + [Excluded(strategy=str(s), kind=ExcludedKind.OUT_OF_MEMORY) for s in self.oom_here["strategy"]])

    def decision(self, cells: pd.DataFrame, excluded: pd.Series, vary: list[str],
                 elsewhere: dict[tuple[str, int], float]) -> Decision:
        win, speed = self.best, self.speedup(self.best)
        pairs: tuple[Pair, ...] = ()
        if len(self.g) > 1:
            pairs = (_pair(Against.RUNNER_UP, win, self.g.iloc[1]),)
        made = _priced(cells, self.decide())
        made["pairs"] = made.get("pairs", ()) + pairs
        stable, note = win.get("stable"), win.get("scaling_note")
        return Decision(
            workload=str(self.wl), backend=str(self.be), world_size=self.ws,
            knobs={k: str(v) for k, v in self.knobs.items()},
            training={k: str(self.knobs[k]) for k in knobs.NAMES if k in vary and k in self.knobs},
            winner=str(win["strategy"]), runner_up=str(self.g.iloc[1]["strategy"]) if len(self.g) > 1 else None,
            step_ms=float(win["step_time_median_s"]) * 1e3, speedup=speed, candidates=len(self.g),
            bounds=tuple(bounds(win, self.gpu_mem)), noise=f"{win.get('noise')}" if is_false(stable) else None,
            scaling_note=None if note is None or pd.isna(note) else f"{note}",
            tips=tuple(tips(win, backend=str(self.be), ws=self.ws, speedup=speed, elsewhere=elsewhere)),
            excluded=self.excluded(excluded),
            launch_bound=self.launch_bound(), **made)

    def launch_bound(self) -> bool:
        """Judged on the reference that ran (on the fastest where the run has none): a workload whose
        reference was tried and did not run (it ran out of memory, failed) is never called launch-bound."""
        if self.ref is not None:
            return launch_bound(self.ref)
        return not self.ref_tried and launch_bound(self.best)


def recommend(cells: pd.DataFrame, gpu_mem: float | None = None) -> list[Decision]:
    """One decision per (workload, backend, world size >= 2, way of training) that has a candidate
    or whose every cell failed parity (:func:`none_passed`), and one per workload that fits nowhere
    in the matrix (:func:`bench.decide.fits.nowhere`)."""
    cells = _with_scaling_notes(cells)
    good, excluded = candidates(cells)
    by = ["workload", "backend", "world_size", *(k for k in knobs.NAMES if k in good)]
    groups = [Group(cells, g, gpu_mem) for _, g in good[good["world_size"] >= 2].groupby(by, sort=True, dropna=False)]
    vary = knobs.varying(good)  # a decision names the knobs the run compared
    best_speed = {(gr.wl, gr.be, gr.ws, knobs.short(gr.knobs, vary)): gr.speedup(gr.best) for gr in groups}
    out = []
    for gr in groups:
        elsewhere = {(be, ws): s for (wl, be, ws, tr), s in best_speed.items()
                     if wl == gr.wl and tr == knobs.short(gr.knobs, vary) and s is not None}
        out.append(gr.decision(cells, excluded, vary, elsewhere))
    return out + none_passed(cells, good, excluded) + nowhere(cells[cells["mode"] != "serve"] if "mode" in cells
                                                            else cells)


def none_passed(cells: pd.DataFrame, good: pd.DataFrame, excluded: pd.Series) -> list[Decision]:
    """A decision for each (workload, backend, world size >= 2, way of training) whose cells ran but
    none qualified, because each failed parity with one device or was never checked: no answer, and
    why, with the failure of the cell nearest to passing (its tolerance, step and, for BatchNorm, the
    fix). Groups of independent models alone get none: they are never candidates."""
    ran = cells.loc[excluded.index]
    ran = ran[ran["world_size"] >= 2]
    by = ["workload", "backend", "world_size", *(k for k in knobs.NAMES if k in ran)]
    multi = good[good["world_size"] >= 2]
    taken = {tuple(map(str, k)) for k, _ in multi.groupby([c for c in by if c in multi], dropna=False)}
    vary = knobs.varying(cells[cells["status"] == "ok"])
    out = []
    for key, g in ran.groupby(by, sort=True, dropna=False):
        why = [excluded[i] for i in g.index]
        if tuple(map(str, key)) in taken or all(e.kind == ExcludedKind.INDEPENDENT for e in why):
            continue
        err = g["parity_rel_err"] if "parity_rel_err" in g else pd.Series(float("nan"), index=g.index)
        err = err[[e.kind == ExcludedKind.PARITY_FAILED for e in why]].dropna()
        closest = g.loc[err.astype(float).idxmin()] if len(err) else None
        r = g.iloc[0]
        kn = {k: str(r[k]) for k in knobs.NAMES if k in r and pd.notna(r[k])}
        out.append(Decision(
            workload=str(r["workload"]), backend=text(r.get("backend")), world_size=int(r["world_size"]),
            knobs=kn, training={k: v for k, v in kn.items() if k in vary}, winner="", step_ms=0.0,
            kind=DecisionKind.UNDECIDED, ground=Ground.NONE_PASSED, resolved=True, excluded=tuple(why),
            nearest_parity=None if closest is None else f"{text(closest['strategy'])}: {parity_failure(closest)}"))
    return out


def first_screen(decisions: list[Decision]) -> list[Decision]:
    """Decisions in the order the first screen shows them: real-model ones before launch-bound ones;
    within each, resolved decisions, then leading ones, then those without a decision."""
    return sorted(decisions, key=lambda p: (p.launch_bound, not p.resolved, p.use is None))
