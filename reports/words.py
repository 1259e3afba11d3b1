"""Every sentence of the recommendation, from :class:`bench.decide.decision.Decision` values: the
same words on the report's first screen and at the end of ``parbench run`` (what to use, or that
there is no decision; whether it is decided, why, what was measured, what bounds the fastest step
and what to try next), launch-bound (toy) workloads apart from the rest.
"""

from __future__ import annotations

import re

import pandas as pd

from bench.core import knobs
from bench.core.text import gap_text, lead
from bench.decide.decision import (
    Against,
    Blocker,
    BlockerKind,
    Bound,
    BoundKind,
    Change,
    ChangeKind,
    Decision,
    DecisionKind,
    ExcludedKind,
    Ground,
    LeadReason,
    OomKind,
    Pair,
    PartKind,
    Tip,
    TipKind,
    Verdict,
    title_of,
)
from bench.decide.recommend import first_screen
from bench.decide.rules import EQUIVALENT, bounds, is_false
from bench.stats.steps import EFFICIENCY_MAX

#: why a launch-bound workload's pick is kept off the first screen
LAUNCH_BOUND_WHY = ("the single-device step is under 10 ms or mostly idle: it measures kernel launches and "
                    "Python more than the strategy, so these picks say little about a real model")
MS = 1e3
GIB = 2**30


def split(decisions: list[Decision]) -> tuple[list[Decision], list[Decision]]:
    """(decisions of real workloads, those of launch-bound ones), each in first-screen order."""
    ordered = first_screen(decisions)
    return [p for p in ordered if not p.launch_bound], [p for p in ordered if p.launch_bound]


def head(p: Decision) -> str:
    """How the first line of a decision starts: its title and a colon."""
    return f"{p.title}: "


def training_text(p: Decision) -> str:
    """The knobs the run varies, as this decision's values ('compile=on'; '' for none)."""
    return knobs.short(p.training, list(p.training))


def use_text(p: Decision) -> str:
    """The answer: a strategy, 'one device', or 'no decision'."""
    if p.use is None:
        return "no decision"
    return "one device" if p.kind == DecisionKind.ONE_DEVICE else p.use


def open_text(p: Decision) -> str:
    """What would resolve an open decision, in a few words."""
    if p.repeats_needed is None:
        return "more repeats would not separate them" if p.open_cells else "nothing to repeat"
    took = f", ~{p.minutes_needed:.0f} min" if p.minutes_needed is not None and p.minutes_needed >= 1 \
        else (", under a minute" if p.minutes_needed is not None else "")
    return f"needs about {p.repeats_needed} repeats a cell{took}"


def decided_text(p: Decision) -> str:
    """'decided', 'leading, not decided (what would decide it)' or 'no' (there is no answer: the use
    column says so, and the because column why)."""
    if p.use is None:
        return "no"
    return "decided" if p.resolved else f"leading, not decided ({open_text(p)})"


def noise_text(p: Decision) -> str:
    """Whether the fastest is ahead of the runner-up beyond the noise."""
    if p.significant is None:
        return "one run: not judged"
    if p.significant and p.same_speed:
        return f"beyond the noise, within {EQUIVALENT:.0%}: the same speed"
    return "beyond the noise" if p.significant else "within the noise"


def measured_text(p: Decision) -> str:
    """What was measured: the fastest candidate, its step, its speed-up, its lead."""
    if p.ground == Ground.FITS_NOWHERE:
        return "nothing ran"
    if p.ground == Ground.NONE_PASSED:
        return f"{len(p.excluded)} cells ran; none matched one device"
    out = f"fastest: {p.winner} {p.step_ms:.1f} ms/step"
    if p.speedup is not None:
        out += f", {p.speedup:.2f}x one device"
    if p.runner_up is not None and p.margin is not None:
        out += f"; {lead(p.margin)} ahead of {p.runner_up} ({noise_text(p)})"
    return out


# -- why the decision --------------------------------------------------------------------------------


def _label(b: Blocker) -> str:
    return "one device" if b.reference else b.strategy


def _blocked(b: Blocker) -> str:
    if b.kind == BlockerKind.UNPHYSICAL and isinstance(b.detail, float):
        return f"{_label(b)} (efficiency {b.detail:.2f} > {EFFICIENCY_MAX})"
    return f"{_label(b)} ({b.detail})" if b.detail else _label(b)


_BLOCKED = {BlockerKind.NOT_STABLE: "not stable", BlockerKind.CONTENDED: "contended",
            BlockerKind.UNPHYSICAL: "efficiency not physical"}


def blockers_text(blockers: tuple[Blocker, ...]) -> str:
    """'not stable: one device (cv 12%); contended: ddp (...)': what blocks a decision, by kind."""
    by: dict[BlockerKind, list[str]] = {}
    for b in blockers:
        by.setdefault(b.kind, []).append(_blocked(b))
    return "; ".join(f"{_BLOCKED[k]}: {', '.join(v)}" for k, v in by.items())


def _reason(r: LeadReason, p: Decision, other: str) -> str:
    a, b = r.winner, r.other
    timed = {PartKind.EXPOSED_COMM: "exposed communication", PartKind.COMPUTE: "compute"}
    if r.part == PartKind.PARAM_DTYPE:
        return (f"its parameters are bf16 (FSDP's MixedPrecisionPolicy) where {other} casts fp32 ones under "
                f"autocast (compute {a * MS:.1f} vs {b * MS:.1f} ms a step)")
    if r.part in timed:
        return f"less {timed[r.part]} ({a * MS:.1f} vs {b * MS:.1f} ms a step)"
    if r.part == PartKind.CALLS:
        return f"fewer calls ({a:.0f} vs {b:.0f} a step)"
    if r.part == PartKind.BYTES:
        return f"fewer bytes ({a * 2**-20:.0f} MiB vs {b * 2**-20:.0f} MiB a step)"
    if r.part in (PartKind.IDLE, PartKind.BUBBLE):
        return f"{'less idle' if r.part == PartKind.IDLE else 'smaller bubble'} ({a:.0%} vs {b:.0%} of the step)"
    if r.part == PartKind.BREAKDOWN_OFF:
        return "the times of the breakdown do not say why (" + ", ".join(
            f"{n}'s profiled step is {gap_text(g)} off its timed one" for n, g in ((p.winner, a), (other, b))
            if g is not None) + ")"
    if r.part == PartKind.NO_BREAKDOWN:
        return "no breakdown says why (profiling off)"
    return "no part of the breakdown differs by 10%"


def reasons_text(p: Decision) -> str:
    """Why the fastest steps faster than the library default, from their breakdowns."""
    rival = p.pair(Against.RIVAL)
    return ", ".join(_reason(r, p, rival.b_strategy if rival else "") for r in p.reasons)


def _vs(pair: Pair) -> str:
    """How a lead compares with the noise."""
    if pair.verdict == Verdict.A:
        return "beyond the noise"
    if pair.verdict == Verdict.SAME:
        return f"within {EQUIVALENT:.0%}, the same speed"
    return "in one run" if pair.verdict == Verdict.OPEN and not pair.repeated else "within the noise"


def _one_device(p: Decision) -> str:
    s, best = p.speedup, p.winner
    if p.ground == Ground.GROSS:
        ref = p.pair(Against.ONE_DEVICE)
        once = "" if ref is not None and ref.repeated else " (one run a cell)"
        out = (f"every candidate is slower than one device, by at least {1 / s:.1f}x: the best, {best}, "
               f"reaches {s:.2f}x{once}, a gap no noise of this run explains")
        return out + (f" (the finer ranking is open: {blockers_text(p.blockers)})" if p.blockers else "")
    if p.ground == Ground.SLOWER:
        return f"every candidate is slower than one device: the best, {best}, reaches {s:.2f}x"
    if p.ground == Ground.SAME_AS_ONE:
        return f"no candidate is faster than one device: the best, {best}, reaches {s:.2f}x, within {EQUIVALENT:.0%}"
    out = f"no candidate is faster than one device beyond the noise: the best, {best}, reaches {s:.2f}x"
    ref = p.pair(Against.ONE_DEVICE)
    return out + (f", under {EQUIVALENT:.0%} ahead, which more repeats here would not separate"
                  if p.resolved and ref is not None and ref.verdict == Verdict.OPEN else "")


def _strategy(p: Decision) -> str:
    if p.ground == Ground.ONLY:
        return "the only strategy that passed"
    rival = p.pair(Against.RIVAL)
    if p.ground == Ground.AHEAD:
        kind = "the library default" if p.kind == DecisionKind.LIBRARY else "the fastest (no library default ran)"
        return f"{kind}, {lead(rival.lead)} ahead of {rival.b_strategy} {_vs(rival)}"
    if p.ground == Ground.FASTER:
        return f"{lead(rival.lead)} faster than {rival.b_strategy} (library default) beyond the noise: " \
               f"{reasons_text(p)}"
    still = rival.verdict == Verdict.OPEN
    stands = "; it stands until repeats say otherwise" if not p.resolved else \
        f"; it stands: the lead is under {EQUIVALENT:.0%} and more repeats here would not separate them"
    return f"{p.winner} leads it by {lead(rival.lead)} {_vs(rival)}" + (f" ({reasons_text(p)})" if still else "") \
        + (stands if still else "")


_OOM = {OomKind.KILLED: "killed by SIGKILL, on Linux the kernel's out-of-memory killer"}


def oom_text(kind: OomKind | None) -> str:
    """How a cell ran out of memory, in a few words."""
    return _OOM.get(kind, "out of memory")


def peak_text(f) -> str:
    """'peak 60.0 of 79.1 GiB, 24% headroom' of a :class:`Fit` ('predicted peak' where nothing
    measured it; 'at least' for a lower bound)."""
    if f.peak_bytes is None:
        return "peak memory not measured"
    what = ("predicted peak" if f.predicted else "peak") + (" at least" if f.lower_bound else "")
    if not f.device_bytes:
        return f"{what} {f.peak_bytes / GIB:.1f} GiB (device size not known)"
    room = f", {f.headroom:.0%} headroom" if f.headroom is not None and f.headroom >= 0 else ""
    return f"{what} {f.peak_bytes / GIB:.1f} of {f.device_bytes / GIB:.1f} GiB{room}"


def fit_text(p: Decision) -> str:
    """'does not fit one device (single: out of memory); peak 60.0 of 79.1 GiB, 24% headroom' ('' when it fits)."""
    f = p.fit
    if f is None or f.fits_one_device is not False or p.ground == Ground.FITS_NOWHERE:
        return ""
    unchecked = "" if f.parity_checked else "; parity not checked (no device ran the whole model)"
    return f"does not fit one device ({f.reference}: {oom_text(f.oom)}); {peak_text(f)}{unchecked}"


def memory_caption(unmeasured: bool) -> str:
    """What the memory figure and table show (``unmeasured``: no cell measured its peak: CPU)."""
    out = ("Memory: the memory model's predicted peak of each cell's fullest device, made before it ran, stacked "
           "by component (the gradients at the optimizer step's peak, the activations at backward's, which include "
           "the gradients existing then); markers are what was measured (the allocator's allocated and reserved "
           "peak, NVML's process memory), the dashed line the memory a rank has; error: predicted / measured - 1; "
           "fits b/dev: the largest micro-batch per device predicted to fit with a 10% margin.")
    if unmeasured:
        out += (" Nothing here measures a peak (a CPU run has no allocator peak): the thin hatched bars and "
                "'counted / predicted' are the bytes of parameters, gradients and optimizer state counted on the "
                "rank against their prediction; the activations are not checked.")
    return out


def nowhere_text(p: Decision) -> str:
    """Why a workload has no decision when it fits nowhere in the matrix."""
    f = p.fit
    one = f" (one device: {f.reference}, {oom_text(f.oom)})" if f.reference else ""
    if f.peak_bytes is None:
        return f"it fits nowhere in the matrix: every cell ran out of memory{one}; no cell's row holds a prediction"
    missed = ("; it was predicted to fit and ran out while running: the memory model under-predicts it, so the "
              "peaks below are low" if f.missed else "")
    return (f"it fits nowhere in the matrix: every cell ran out of memory{one}; nearest: {f.nearest}, "
            f"{peak_text(f)}{missed}")


def change_text(c: Change) -> str:
    """One change that would make the model fit, with its predicted allocated peak."""
    peak = f"predicted peak {c.peak_bytes / GIB:.1f} GiB" if c.peak_bytes is not None else ""
    if c.kind == ChangeKind.SHARD_OPTIMIZER:
        what = f"a sharded optimizer ({c.strategy} x{c.world_size})"
    elif c.kind == ChangeKind.CHECKPOINT:
        if c.peak_bytes is None:
            share = f"{c.activations:.0%} of the peak is activations" if c.activations is not None else \
                "the activations are part of the peak"
            return f"activation checkpointing (--ac full): {share}, which it would remove most of"
        what = f"activation checkpointing (--ac full, as cell {c.cell} of this run)"
    elif c.kind == ChangeKind.SMALLER_BATCH:
        if not c.batch:
            return "a smaller batch: not one sample per device is predicted to fit"
        what = f"a micro-batch of {c.batch} per device" + (f" (now {c.now:g})" if c.now is not None else "")
    else:
        what = f"the model cut over {c.world_size} devices ({c.strategy} x{c.world_size})"
    where = "; on CPU more ranks share one host's memory: more hosts" if c.hosts else ""
    fits = {True: ", fits", False: ", still too large", None: ""}[c.fits]
    return f"{what}: {peak}{fits}{where}" if peak else f"{what}{fits}{where}"


def changes_text(p: Decision) -> str:
    """The changes that would make a model that fits nowhere fit: the cheapest that fits first."""
    ch = p.fit.changes if p.fit else ()
    if not ch:
        return ""
    first, rest = ch[0], ch[1:]
    lead_in = "cheapest change that fits: " if first.fits else "changes: "
    return lead_in + change_text(first) + ("; also " + "; ".join(map(change_text, rest)) if rest else "")


def none_passed_text(p: Decision) -> str:
    """'no strategy matched one device (ddp, fsdp failed parity); the nearest, fsdp: parity ... failed
    ...': why a group whose cells ran has no candidate."""
    failed = [e.strategy for e in p.excluded if e.kind == ExcludedKind.PARITY_FAILED]
    unchecked = [e.strategy for e in p.excluded if e.kind == ExcludedKind.PARITY_UNCHECKED]
    parts = ([f"{', '.join(failed)} failed parity"] if failed else []) \
        + ([f"{', '.join(unchecked)} not checked (no single-device reference)"] if unchecked else [])
    return f"no strategy matched one device ({'; '.join(parts)})" \
        + (f"; the nearest, {p.nearest_parity}" if p.nearest_parity else "")


def because_text(p: Decision) -> str:
    """Why the decision points where it does (or why there is none)."""
    if p.ground == Ground.BLOCKED:
        return blockers_text(p.blockers)
    if p.ground == Ground.FITS_NOWHERE:
        return nowhere_text(p)
    if p.ground == Ground.NONE_PASSED:
        return none_passed_text(p)
    if p.kind == DecisionKind.ONE_DEVICE:
        return _one_device(p)
    fit = fit_text(p)
    return (f"{fit}; " if fit else "") + _strategy(p)


# -- what bounds the fastest step, what was left out, what to try --------------------------------------


def _bound(b: Bound) -> str:
    v = b.value
    if b.kind == BoundKind.COMMUNICATION:
        return f"communication-bound ({v:.0%} of the step is exposed communication)"
    if b.kind == BoundKind.BUBBLE:
        return f"pipeline bubble {v:.0%}"
    if b.kind == BoundKind.MEMORY:
        return f"memory-bound ({v:.0%} of the GPU)"
    if b.kind == BoundKind.LAUNCH:
        return f"launch-bound ({v:.0%} of the step the device is idle)"
    if b.kind == BoundKind.OFF:
        return f"bound not known (its profiled step is {gap_text(v)} off the timed one" + (
            f"; built again for profiling it ran {gap_text(b.moved)} off unprofiled: its step moves from build "
            "to build)" if b.moved is not None else ")")
    if b.kind == BoundKind.NO_BREAKDOWN:
        return "bound not known (no breakdown" + (f": {b.note})" if b.note else ")")
    return f"compute-bound (MFU {v:.0%})" if v is not None else "compute-bound"


def bound_text(p: Decision) -> str:
    """What bounds the fastest step, with its noise and scaling note."""
    if p.ground in (Ground.FITS_NOWHERE, Ground.NONE_PASSED):
        return "no candidate's step to bound"
    return _bounds_line(p.bounds, p.noise, p.scaling_note)


def _bounds_line(parts, noise: str | None, note: str | None) -> str:
    return "; ".join([_bound(b) for b in parts] + ([f"noisy: {noise}"] if noise is not None else [])
                     + ([f"scaling: {note}"] if note is not None else []))


def why(r: pd.Series, gpu_mem: float | None = None) -> str:
    """One line of why a cell's step takes what it takes, from its measurements."""
    note = r.get("scaling_note")
    return _bounds_line(bounds(r, gpu_mem), f"{r.get('noise')}" if is_false(r.get("stable")) else None,
                        None if note is None or pd.isna(note) else f"{note}")


_LEFT = {ExcludedKind.INDEPENDENT: "trains independent models",
         ExcludedKind.PARITY_UNCHECKED: "parity not checked (no single-device reference)",
         ExcludedKind.OUT_OF_MEMORY: "out of memory"}


def excluded_text(p: Decision) -> str:
    """What was left out and why: 'ddp: out of memory; ensemble: trains independent models' (an
    out-of-memory cell's detail is its world size: 'ddp x2: out of memory')."""
    return "; ".join(f"{e.strategy}: {e.detail}" if e.kind == ExcludedKind.PARITY_FAILED else
                     f"{e.strategy}{' ' + e.detail if e.detail else ''}: {_LEFT[e.kind]}" for e in p.excluded)


def _tip(t: Tip, ws: int) -> str:
    if t.kind == TipKind.BACKEND:
        return f"the {t.name} backend" + (f" ({t.value:.2f}x at x{ws})" if t.value is not None else "")
    if t.kind == TipKind.FEWER_DEVICES:
        return f"fewer devices (x{t.size} reaches {t.value:.2f}x)"
    if t.kind == TipKind.BIGGER_BATCH:
        return "a bigger batch per device" + (f" ({t.value:g} samples now)" if t.value is not None else "")
    return f"another --option {t.name} (now {t.value:g} MiB) for more overlap"


def next_text(p: Decision) -> str:
    """What to try when nothing scales ('' when it does: an undecided pick already says what decides it);
    for a model that fits nowhere, the changes that would make it fit."""
    if p.ground == Ground.FITS_NOWHERE:
        return changes_text(p)
    return "try " + "; ".join(_tip(t, p.world_size) for t in p.tips) if p.tips else ""


def lines(p: Decision) -> list[str]:
    """The decision as a few short lines for a terminal: the answer first, then what was measured and
    what to try next (what was left out is in the report, and failed parity in the run's summary)."""
    if p.use is None:
        first = head(p) + f"no decision: {because_text(p)}"
    elif p.resolved:
        first = head(p) + f"use {use_text(p)}: {because_text(p)}"
    else:
        first = head(p) + f"{use_text(p)} leads, not decided ({open_text(p)}): {because_text(p)}"
    out = [first] if p.ground in (Ground.FITS_NOWHERE, Ground.NONE_PASSED) else \
        [first, f"{measured_text(p)}; {bound_text(p)}"]
    if next_text(p):
        out.append(f"next: {next_text(p)}")
    return out


def nothing_beyond_one(training: pd.DataFrame) -> str:
    """Why no decision exists, from the run's training cells: what became of the cells on more
    than one device ('2 skipped (deadline passed before this cell's group), 1 failed (...)'), or
    that the run had none."""
    multi = training[training["world_size"] > 1] if "world_size" in training else training.iloc[:0]
    if multi.empty:
        return "no cell on more than one device was planned"
    if (multi["status"] == "ok").any():
        return "no strategy on more than one device passed"
    parts = []
    for status, g in multi.groupby("status", sort=True):
        reason = next((str(r) for r in g.get("reason", pd.Series(dtype=object)) if isinstance(r, str) and r), "")
        parts.append(f"{len(g)} {status}" + (f" ({reason[:120]})" if reason else ""))
    return "no cell on more than one device ran: " + ", ".join(parts)


def screen(real: list[Decision], toys: list[Decision], nothing: str = "no strategy on more than one device passed"
           ) -> list[tuple[str, str]]:
    """The recommendation as the last lines of ``parbench run``, as (line, indent) before wrapping:
    each real workload's decision in full, then the launch-bound ones' first lines; ``nothing``
    (:func:`nothing_beyond_one`) where there is no decision."""
    if not real and not toys:
        return [(f"recommendation: {nothing}", "")]
    out = [("recommendation:" if real else f"recommendation: every workload is launch-bound: {LAUNCH_BOUND_WHY}", "")]
    for p in real:
        first, *rest = lines(p)
        out += [(first, "  ")] + [(line, "    ") for line in rest]
    if toys and real:
        out.append((f"launch-bound workloads ({LAUNCH_BOUND_WHY}):", ""))
    out += [(lines(p)[0], "  ") for p in toys]
    return out


#: how a line of :func:`screen` that is not the continuation of a wrapped one starts
_STARTS = re.compile(r"(recommendation|launch-bound workloads \(|fastest: |next: |\S+, \S+ x\d+(, [^:]+)?: )")


def said(text: str, workload: str, backend: str, ws: int) -> str:
    """What a printed :func:`screen` says for one workload, backend and world size (its knobs
    aside), on one line without its title: the decision's first line with its wrapped
    continuations, not what was measured ('' when it has no such decision). Indentation plays no
    part: a line that starts like none of the screen's lines continues the one before."""
    start = f"{title_of(workload, backend, ws)}: "
    found: list[str] = []
    for line in (x.strip() for x in text.splitlines()):
        if found and (not line or _STARTS.match(line)):
            break
        if found:
            found.append(line)
        elif line.startswith(start):
            found.append(line[len(start):])
    return " ".join(found)
