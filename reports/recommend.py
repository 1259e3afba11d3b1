"""The answer a reader came for: per workload, backend and world size, which strategy to use.

A candidate is a cell that ran (status ok: it also passed the distribution check), matched the
single-device run (parity ok) and trains the same model (not an ensemble of independent models).
The fastest candidate wins; the margin over the runner-up is called significant only when their
intervals of the median step do not overlap (otherwise it is within the measured noise). One line
of why comes from the winner's own measurements.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

#: thresholds of the "why" line, as fractions of the step
COMM_BOUND, BUBBLE_BOUND, IDLE_BOUND, MEMORY_BOUND = 0.30, 0.20, 0.30, 0.90


@dataclass(frozen=True, kw_only=True)
class Pick:
    workload: str
    backend: str
    world_size: int
    winner: str
    step_ms: float
    runner_up: str | None
    margin: float | None  # runner-up step / winner step - 1
    significant: bool | None
    why: str
    candidates: int
    excluded: str  # what was left out and why
    speedup: float | None = None  # throughput against the single-device cell of the same workload

    def line(self) -> str:
        head = f"{self.workload}, {self.backend} x{self.world_size}: {self.winner} ({self.step_ms:.1f} ms/step"
        if self.speedup is not None:
            head += (f", {self.speedup:.2f}x one device)" if self.speedup >= 1
                     else f", slower than one device: {self.speedup:.2f}x)")
        else:
            head += ")"
        if self.runner_up is None:
            tail = "the only strategy that passed"
        elif self.significant:
            tail = f"{self.margin:+.0%} ahead of {self.runner_up}, beyond the noise"
        elif self.significant is None:
            tail = f"{self.margin:+.0%} ahead of {self.runner_up}, noise not judged (measure with --repeats 3 or more)"
        else:
            tail = f"{self.margin:+.0%} ahead of {self.runner_up}, within the noise (intervals overlap)"
        return f"{head}; {tail}; {self.why}" + (f" [{self.excluded}]" if self.excluded else "")


def candidates(cells: pd.DataFrame) -> tuple[pd.DataFrame, pd.Series]:
    """(cells that qualify, reason per excluded ran-ok cell)."""
    ok = cells[cells["status"] == "ok"]
    why = pd.Series("", index=ok.index, dtype="object")
    if "role" in ok:
        why[ok["role"] == "independent"] = "trains independent models"
    if "parity_ok" in ok:
        par = ok["parity_ok"]
        why[(why == "") & (par == False)] = "parity failed"  # noqa: E712 - pandas boolean
        # Never checked is not passed: no reference, or no losses to compare (one device is its own).
        why[(why == "") & par.isna() & (ok["world_size"] > 1)] = "parity not checked (no single-device reference)"
    return ok[why == ""], why[why != ""]


def reason(r: pd.Series, gpu_mem: float | None = None) -> str:
    """One line of why a cell's step takes what it takes, from its measurements."""
    parts = []
    exposed, compute, idle = r.get("exposed_comm_s"), r.get("compute_time_s"), r.get("idle_frac")
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
    if not parts and (compute is None or pd.isna(compute)):
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


def is_false(v) -> bool:
    """A flag that is known and false (NA is not false)."""
    return v is not None and not pd.isna(v) and not bool(v)


def _overlap(a: pd.Series, b: pd.Series) -> bool | None:
    lo_a, hi_a, lo_b, hi_b = (x.get(k) for x in (a, b) for k in ("step_time_ci_low_s", "step_time_ci_high_s"))
    if any(pd.isna(v) for v in (lo_a, hi_a, lo_b, hi_b)):
        return None
    return bool(lo_a <= hi_b and lo_b <= hi_a)


def recommend(cells: pd.DataFrame, gpu_mem: float | None = None) -> list[Pick]:
    """One pick per (workload, backend, world size >= 2) that has a candidate."""
    good, excluded = candidates(cells)
    out = []
    keys = ["workload", "backend", "world_size"]
    for (wl, be, ws), g in good[good["world_size"] >= 2].groupby(keys, sort=True):
        g = g.sort_values("step_time_median_s")
        win = g.iloc[0]
        left = cells.loc[excluded.index]
        left = left[(left["workload"] == wl) & (left["backend"] == be) & (left["world_size"] == ws)]
        note = "; ".join(f"{r.strategy}: {excluded[i]}" for i, r in left.iterrows())
        if len(g) > 1:
            second = g.iloc[1]
            overlap = _overlap(win, second)
            margin = float(second["step_time_median_s"] / win["step_time_median_s"] - 1)
            # Only intervals built from repeats can call a margin beyond the noise: the steps of one
            # run are correlated and their interval is too narrow (bench/stats/steps.py).
            judged = all(str(x.get("ci_basis", "")).startswith("repeats") for x in (win, second))
            runner = str(second["strategy"])
            sig = None if (overlap is None or not judged) else not overlap
        else:
            runner, margin, sig = None, None, None
        single = cells[(cells["workload"] == wl) & (cells["status"] == "ok") & (cells["world_size"] == 1)
                       & (cells["strategy"] == "single")]
        if "global_batch" in cells and pd.notna(win.get("global_batch")):
            single = single[single["global_batch"] == win["global_batch"]]
        speed = (float(win["throughput_samples_s"] / single["throughput_samples_s"].iloc[0])
                 if len(single) and pd.notna(win.get("throughput_samples_s")) else None)
        out.append(Pick(workload=str(wl), backend=str(be), world_size=int(ws), winner=str(win["strategy"]),
                        step_ms=float(win["step_time_median_s"]) * 1e3, runner_up=runner, margin=margin,
                        significant=sig, why=reason(win, gpu_mem), candidates=len(g), excluded=note,
                        speedup=speed))
    return out
