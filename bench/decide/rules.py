"""The rules behind a recommendation, one small function each, on the rows of a cells table.

:mod:`bench.decide.recommend` applies them per workload, backend and world size. Here: which strategy is
the library default, when one cell is faster than another beyond the noise, what stops a decision
(an unstable or contended cell, an efficiency that is not physical), whether the model fits one
device, why one cell beats another, whether a workload is launch-bound, and what to try next when
nothing scales.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import pandas as pd

from bench.core.metrics import BREAKDOWN_GAP_MAX
from bench.decide.decision import (
    Blocker,
    BlockerKind,
    Bound,
    BoundKind,
    LeadReason,
    OomKind,
    PartKind,
    Tip,
    TipKind,
    Verdict,
)
from bench.stats.steps import EFFICIENCY_MAX
from strategies.catalog import DECLARED

#: thresholds of the "why" line, as fractions of the step
COMM_BOUND, BUBBLE_BOUND, IDLE_BOUND, MEMORY_BOUND = 0.30, 0.20, 0.30, 0.90
#: a workload whose single-device step is shorter than this, or idle for at least this share of it,
#: measures kernel launches and Python more than the strategy (a toy for this question)
LAUNCH_STEP_S, LAUNCH_IDLE = 0.010, 0.50
#: scaling efficiency under which the next-step hint is given although the step got faster
SCALES_POORLY = 0.5
#: a part of the breakdown explains a lead when it differs by this share (calls and bytes: this ratio)
EXPLAINS, EXPLAINS_RATIO = 0.10, 1.5
#: two cells whose throughput intervals all lie within this band of each other, or whose intervals
#: are apart but whose medians lie within it, run at the same speed for a decision (a practitioner
#: would not switch strategies for less)
EQUIVALENT = 0.03
#: one device wins however noisy the cells: the fastest candidate reaches at most GROSS_SPEEDUP of one
#: device, and its step's interval starts at least GROSS_APART times past the end of one device's
#: (on 2 loaded cores the default run's toys gave 0.39x with cvs of 13-50%: no noise seen explains that)
GROSS_SPEEDUP, GROSS_APART = 0.5, 1.5
#: an open pair that would need more repeats a cell than this is reported as not decidable by repeats
MAX_REPEATS = 30

_OOM = re.compile(r"out of memory|OutOfMemoryError|can't allocate memory|CUBLAS_STATUS_ALLOC_FAILED|"
                  r"\bMemoryError\b", re.I)
#: a rank killed by SIGKILL (bench.runtime.crash.exit_text; 137 through a shell): in a cell that failed
#: (the launcher's own kills end a cell as a timeout), on Linux the kernel's out-of-memory killer
_KILLED = re.compile(r"signal 9 \(SIGKILL\)|exit(ed with)? code 137\b|exitcode\s*:\s*-9\b")
_PLANNED = "out of memory before it starts"
_CAPACITY = re.compile(r"total capacity of ([0-9.]+) GiB", re.I)


def declared(strategy, name: str) -> str:
    """What a built-in strategy declares in :mod:`strategies.catalog` ('' for another strategy)."""
    d = DECLARED.get(text(strategy))
    return getattr(d, name) if d is not None else ""


def is_reference(cells: pd.DataFrame) -> pd.Series:
    """The single-device reference cells: in the reference role, or, for a row without one, of a
    strategy declared in that role."""
    by_name = pd.Series([declared(s, "role") == "reference" for s in cells["strategy"]], index=cells.index,
                        dtype=bool)
    if "role" not in cells:
        return by_name
    role = cells["role"].astype("string").fillna("")
    return ((role == "reference") | ((role == "") & by_name)).astype(bool)


def is_false(v) -> bool:
    """A flag that is known and false (NA is not false)."""
    return v is not None and not pd.isna(v) and not bool(v)


def text(v) -> str:
    """A string column's value, '' for NA."""
    return v if isinstance(v, str) else ""


def num(v) -> float | None:
    """A numeric column's value, None for NA."""
    return None if v is None or pd.isna(v) else float(v)


def overlap(a: pd.Series, b: pd.Series) -> bool | None:
    """Whether the intervals of two cells' median steps overlap (None: an interval is missing)."""
    lo_a, hi_a, lo_b, hi_b = (x.get(k) for x in (a, b) for k in ("step_time_ci_low_s", "step_time_ci_high_s"))
    if any(pd.isna(v) for v in (lo_a, hi_a, lo_b, hi_b)):
        return None
    return bool(lo_a <= hi_b and lo_b <= hi_a)


def from_repeats(r: pd.Series) -> bool:
    """The cell's interval comes from >= 3 repeats: only such an interval can call a margin beyond
    the noise (the steps of one run are correlated and their interval is too narrow)."""
    return text(r.get("ci_basis")).startswith("repeats")


def _tput_interval(r: pd.Series) -> tuple[float, float] | None:
    """The throughput interval from the step interval (throughput = global batch / step)."""
    t, med = num(r.get("throughput_samples_s")), num(r.get("step_time_median_s"))
    lo, hi = num(r.get("step_time_ci_low_s")), num(r.get("step_time_ci_high_s"))
    if None in (t, med, lo, hi) or lo <= 0:
        return None
    return t * med / hi, t * med / lo


def clears(a: pd.Series, b: pd.Series, band: float = EQUIVALENT) -> bool:
    """Whether ``a``'s throughput leads ``b``'s by more than ``band`` at their intervals' edges (the
    slow end of ``a``'s over the fast end of ``b``'s): a lead beyond the noise that is also larger
    than the band whatever the noise."""
    ia, ib = _tput_interval(a), _tput_interval(b)
    return ia is not None and ib is not None and ia[0] / ib[1] - 1 > band


def repeats_of(r: pd.Series) -> int:
    """The repeats a cell's interval rests on (3 when the table does not say and the basis is repeats)."""
    n = num(r.get("repeats_done"))
    return int(n) if n is not None else (3 if from_repeats(r) else 1)


@dataclass(frozen=True)
class PairVerdict:
    """How two cells compare for a decision: ``SAME`` (both intervals within EQUIVALENT of each
    other, or separated with medians within EQUIVALENT: the difference cannot matter, even where it
    is beyond the noise), ``A`` or ``B`` is faster beyond the noise by more than EQUIVALENT, or
    ``OPEN`` (the intervals overlap by more than that, or one is not from repeats); ``need`` is
    about how many repeats a cell would close an open pair (None: closed, or past MAX_REPEATS)."""

    state: Verdict
    need: int | None = None


def judge_pair(a: pd.Series, b: pd.Series) -> PairVerdict:
    """The pair's verdict from their throughput intervals, and for a separated pair the size of the
    lead from their median throughputs. An open pair's ``need`` assumes each
    interval narrows as one over the square root of the repeats: the repeats at which the two
    half-widths fit inside the gap between the medians (separated) or, for a gap under EQUIVALENT,
    inside what is left of that band (same speed), whichever comes first."""
    ia, ib = _tput_interval(a), _tput_interval(b)
    if ia is None or ib is None:
        return PairVerdict(Verdict.OPEN, None)
    if not (from_repeats(a) and from_repeats(b)):
        return PairVerdict(Verdict.OPEN, 3)
    # the same speed first: both intervals inside the band, so no difference between them can matter
    if max(ia[1], ib[1]) / min(ia[0], ib[0]) - 1 <= EQUIVALENT:
        return PairVerdict(Verdict.SAME)
    if ia[0] > ib[1] or ib[0] > ia[1]:
        # Separated: the lead is real, and the medians are its best estimate. Read at the medians,
        # not at the intervals' edges, the answer for a pair does not depend on how wide this
        # run's intervals happen to be.
        ta, tb = num(a.get("throughput_samples_s")), num(b.get("throughput_samples_s"))
        if max(ta, tb) / min(ta, tb) - 1 <= EQUIVALENT:
            return PairVerdict(Verdict.SAME)
        return PairVerdict(Verdict.A if ia[0] > ib[1] else Verdict.B)
    mid_a, mid_b = (ia[0] + ia[1]) / 2, (ib[0] + ib[1]) / 2
    half = (ia[1] - ia[0]) / (2 * mid_a) + (ib[1] - ib[0]) / (2 * mid_b)
    gap = abs(mid_a - mid_b) / min(mid_a, mid_b)
    factors = [(half / gap) ** 2] if gap > 0 else []
    if gap < EQUIVALENT:
        factors.append((half / (EQUIVALENT - gap)) ** 2)
    n = min(repeats_of(a), repeats_of(b))
    need = math.ceil(n * min(factors)) if factors else None
    return PairVerdict(Verdict.OPEN, need if need is not None and need <= MAX_REPEATS else None)


def is_oom(reason) -> bool:
    """A failure reason that says the device (or host) ran out of memory."""
    return bool(_OOM.search(text(reason)))


def oom_kind(status, reason) -> OomKind | None:
    """How a cell of ``status`` ran out of memory, from its reason (None: it did not): skipped as
    predicted not to fit, an allocation that failed, or a rank killed by SIGKILL (a cell that
    failed so: the launcher's own kills end a cell as a timeout, so on Linux it is the kernel's
    out-of-memory killer)."""
    status, why = text(status), text(reason)
    if status not in ("failed", "skipped"):
        return None
    if _PLANNED in why:
        return OomKind.PLANNED
    if is_oom(why):
        return OomKind.RAN_OUT
    return OomKind.KILLED if status == "failed" and _KILLED.search(why) else None


def ran_out(cells: pd.DataFrame) -> pd.Series:
    """Which cells failed for lack of memory (an allocation failed, or a rank was killed by SIGKILL),
    or were skipped because they could not fit (bench.plan.memory)."""
    reasons = cells["reason"] if "reason" in cells else pd.Series("", index=cells.index)
    return pd.Series([oom_kind(s, r) is not None for s, r in zip(cells["status"], reasons)], index=cells.index,
                     dtype=bool)


def capacity_from(reason) -> float | None:
    """The device's memory in bytes as a CUDA out-of-memory message states it."""
    m = _CAPACITY.search(text(reason))
    return float(m.group(1)) * 2**30 if m else None


def library_default(g: pd.DataFrame, sharding: bool) -> pd.Series | None:
    """The candidate a practitioner takes unless another is faster beyond the noise: the strategy
    declared the default for a model that must be sharded when it must, else the one declared for a
    model that fits (the other of the two when the first did not qualify)."""
    order = ("sharded", "fits") if sharding else ("fits", "sharded")
    case = [declared(s, "default_for") for s in g["strategy"]]
    for want in order:
        hit = g[[c == want for c in case]]
        if len(hit):
            return hit.iloc[0]
    return None


def blockers(rows: list[tuple[pd.Series, bool, float | None]], ws: int) -> list[Blocker]:
    """Why no decision can rest on these cells, by kind: cells the run marks unstable and measured
    in one run (an unstable cell with repeats has an interval from its repeat medians, which carries
    its noise: it widens the interval instead of blocking), cells measured on a contended host,
    efficiencies that are not physical (the run's ``scaling_unphysical``, or above EFFICIENCY_MAX
    when the table has no scaling note). ``rows`` are (row, is the reference, speed-up). A reference
    the run marks unstable shows up as its own row, not again in each candidate's note."""
    unstable, busy, unphysical = [], [], []
    for r, ref, s in rows:
        def one(kind, detail):
            cid = num(r.get("cell_id"))
            return Blocker(kind=kind, strategy=text(r.get("strategy")), cell=None if cid is None else int(cid),
                           reference=ref, detail=detail)
        if is_false(r.get("stable")) and not from_repeats(r):
            unstable.append(one(BlockerKind.NOT_STABLE, text(r.get("noise"))))
        elif text(r.get("contended")):
            busy.append(one(BlockerKind.CONTENDED, text(r.get("contended"))))
        note, flag = text(r.get("scaling_note")), r.get("scaling_unphysical")
        if flag is not None and not pd.isna(flag) and bool(flag):
            unphysical.append(one(BlockerKind.UNPHYSICAL, note.split(";")[0]))
        elif not note and s is not None and s / ws > EFFICIENCY_MAX:
            unphysical.append(one(BlockerKind.UNPHYSICAL, s / ws))
    return unstable + busy + unphysical


def _span(r: pd.Series) -> float | None:
    """The profiled step (the breakdown's own step), or compute + exposed over the busy share."""
    span = num(r.get("profiled_step_s"))
    exposed, compute, idle = (num(r.get(k)) for k in ("exposed_comm_s", "compute_time_s", "idle_frac"))
    if span is None and None not in (exposed, compute, idle) and idle < 1:
        span = (compute + exposed) / (1 - idle)
    return span if span else None


def comm_share(r: pd.Series) -> float | None:
    """Exposed communication as a share of the profiled step."""
    exposed, span = num(r.get("exposed_comm_s")), _span(r)
    return exposed / span if exposed is not None and span else None


def breakdown_off(r: pd.Series) -> float | None:
    """How far the cell's profiled step is from its timed median, when further than BREAKDOWN_GAP_MAX."""
    gap = num(r.get("breakdown_gap"))
    if gap is None:
        span, med = _span(r), num(r.get("step_time_median_s"))
        gap = span / med - 1 if span and med else None
    return gap if gap is not None and abs(gap) > BREAKDOWN_GAP_MAX else None


def rebuild_off(r: pd.Series) -> float | None:
    """How far a deferred profile pass's unprofiled steps are from the timed median, when further
    than BREAKDOWN_GAP_MAX: the cell built again for its profile pass (``profile_builds`` times)
    ran another step before any profiling (its step moves from build to build), so no profiled
    step of that build can describe the timed one."""
    if num(r.get("profile_builds")) is None:  # profiled in the timed repeat's own build (inline)
        return None
    plain, med = num(r.get("unprofiled_step_s")), num(r.get("step_time_median_s"))
    gap = plain / med - 1 if plain and med else None
    return gap if gap is not None and abs(gap) > BREAKDOWN_GAP_MAX else None


def lead_reasons(win: pd.Series, other: pd.Series) -> list[LeadReason]:
    """Why ``win`` steps faster than ``other``, from the parts of their breakdowns that differ (the
    first three). A breakdown whose profiled step is more than BREAKDOWN_GAP_MAX off the timed one
    describes another step: its times say nothing here (its counts of calls and bytes still do)."""
    gaps = breakdown_off(win), breakdown_off(other)
    off = any(g is not None for g in gaps)
    parts = []
    # A strategy that declares a parameter dtype column keeps bf16 copies of the parameters for the
    # step (FSDP's MixedPrecisionPolicy); autocast (the others' bf16) casts fp32 parameters at every
    # use: less compute for the same model.
    a, b = num(win.get("compute_time_s")), num(other.get("compute_time_s"))
    own, theirs = declared(win.get("strategy"), "param_dtype_column"), declared(other.get("strategy"),
                                                                                 "param_dtype_column")
    cast = (bool(own) and text(win.get(own)) == "bf16" and not (theirs and text(other.get(theirs)) == "bf16")
            and not off and a is not None and b is not None and a < b)
    if cast:  # the compute it saves says so; "less compute" would repeat the numbers
        parts.append(LeadReason(part=PartKind.PARAM_DTYPE, winner=a, other=b))
    timed = [("exposed_comm_s", PartKind.EXPOSED_COMM)] + ([] if cast else [("compute_time_s", PartKind.COMPUTE)])
    for col, part in timed if not off else []:
        a, b = num(win.get(col)), num(other.get(col))
        if a is not None and b and (b - a) / b >= EXPLAINS:
            parts.append(LeadReason(part=part, winner=a, other=b))
    for col, part in (("comm_calls_per_step", PartKind.CALLS), ("comm_bytes_per_step", PartKind.BYTES)):
        a, b = num(win.get(col)), num(other.get(col))
        if a is not None and b and b >= EXPLAINS_RATIO * a:
            parts.append(LeadReason(part=part, winner=a, other=b))
    # the bubble is measured against the timed step; idle is a share of the profiled one
    for col, part in ([("idle_frac", PartKind.IDLE)] if not off else []) + [("bubble_measured", PartKind.BUBBLE)]:
        a, b = num(win.get(col)), num(other.get(col))
        if a is not None and b is not None and b - a >= EXPLAINS:
            parts.append(LeadReason(part=part, winner=a, other=b))
    if off:
        parts.append(LeadReason(part=PartKind.BREAKDOWN_OFF, winner=gaps[0], other=gaps[1]))
    if parts:
        return parts[:3]
    if num(win.get("compute_time_s")) is None or num(other.get("compute_time_s")) is None:
        return [LeadReason(part=PartKind.NO_BREAKDOWN)]
    return [LeadReason(part=PartKind.NONE_DIFFERS)]


def bounds(r: pd.Series, gpu_mem: float | None = None) -> list[Bound]:
    """What bounds a cell's step, from its measurements."""
    parts = []
    exposed, compute, idle = (num(r.get(k)) for k in ("exposed_comm_s", "compute_time_s", "idle_frac"))
    # A breakdown whose profiled step is far from the timed one describes another step: none of its
    # shares says what bounds the timed step (the bubble, from the timed step, and memory still do).
    off = breakdown_off(r)
    if off is not None:
        exposed = compute = idle = None
    # Fractions of the profiled step (the breakdown's own step), never of the timed one: the
    # profiler stretches a step, and a share above 100% would be nonsense.
    span = num(r.get("profiled_step_s"))
    if span is None and None not in (exposed, compute, idle) and idle < 1:
        span = (compute + exposed) / (1 - idle)
    if exposed is not None and span is not None and span > 0 and exposed / span >= COMM_BOUND:
        parts.append(Bound(kind=BoundKind.COMMUNICATION, value=exposed / span))
    bubble = num(r.get("bubble_measured"))
    if bubble is not None and bubble >= BUBBLE_BOUND:
        parts.append(Bound(kind=BoundKind.BUBBLE, value=bubble))
    mem = num(r.get("peak_mem_bytes"))
    if gpu_mem and mem is not None and mem / gpu_mem >= MEMORY_BOUND:
        parts.append(Bound(kind=BoundKind.MEMORY, value=mem / gpu_mem))
    if not parts and idle is not None and idle >= IDLE_BOUND:
        parts.append(Bound(kind=BoundKind.LAUNCH, value=idle))
    if not parts and off is not None:
        parts.append(Bound(kind=BoundKind.OFF, value=off, moved=rebuild_off(r)))
    elif not parts and compute is None:
        # no breakdown (profiling off, or the profile pass failed or was cut): no bound is claimed
        parts.append(Bound(kind=BoundKind.NO_BREAKDOWN, note=text(r.get("profile_note"))))
    elif not parts:
        parts.append(Bound(kind=BoundKind.COMPUTE, value=num(r.get("mfu"))))
    return parts


def launch_bound(r: pd.Series | None) -> bool:
    """The workload's step (its single-device cell, else the leading one) is too short, or the
    device too idle, for the strategy to be what is measured."""
    if r is None:
        return False
    step, idle = num(r.get("step_time_median_s")), num(r.get("idle_frac"))
    return (step is not None and step < LAUNCH_STEP_S) or (idle is not None and idle >= LAUNCH_IDLE)


def tips(best: pd.Series, *, backend: str, ws: int, speedup: float | None,
         elsewhere: dict[tuple[str, int], float]) -> list[Tip]:
    """What to try when nothing scales (the best candidate is slower than one device, or below
    SCALES_POORLY efficiency), the first three; none otherwise. ``elsewhere``: the best speed-up of
    the same workload per (backend, world size)."""
    if speedup is None or (speedup >= 1 and speedup / ws >= SCALES_POORLY):
        return []
    out = []
    better = {k: s for k, s in elsewhere.items() if s > max(speedup, 1) and k != (backend, ws)}
    other_be = [(k, s) for k, s in better.items() if k[1] == ws and k[0] != backend]
    if other_be:
        (be, _), s = max(other_be, key=lambda kv: kv[1])
        out.append(Tip(kind=TipKind.BACKEND, name=str(be), value=float(s)))
    elif backend == "gloo" and text(best.get("device")) == "cuda":
        out.append(Tip(kind=TipKind.BACKEND, name="nccl"))
    fewer = [(k, s) for k, s in better.items() if k[0] == backend and k[1] < ws]
    if fewer:
        (_, w), s = max(fewer, key=lambda kv: kv[1])
        out.append(Tip(kind=TipKind.FEWER_DEVICES, size=int(w), value=float(s)))
    gb, share, idle = num(best.get("global_batch")), comm_share(best), num(best.get("idle_frac"))
    step = num(best.get("step_time_median_s"))
    if (share is not None and share >= COMM_BOUND) or (idle is not None and idle >= IDLE_BOUND) \
            or (step is not None and step < LAUNCH_STEP_S):
        out.append(Tip(kind=TipKind.BIGGER_BATCH, value=gb / ws if gb else None))
    option = declared(best.get("strategy"), "overlap_option")
    now = num(best.get(f"option_{option}")) if option else None
    if share is not None and share >= COMM_BOUND and now is not None:
        out.append(Tip(kind=TipKind.OVERLAP_OPTION, name=option, value=now))
    return out[:3]
