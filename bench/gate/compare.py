"""Compare two runs cell by cell and give a verdict CI can trust.

The verdict of a cell comes from a rank test on its recorded samples, not from the two medians:
per-repeat median step times when both runs hold >= ``MIN_REPEATS`` repeats, else the per-step
times (the step time of a step is its slowest rank). The change is the Hodges-Lehmann shift of
log step time (a ratio, so cells of any speed share one scale) with its distribution-free
confidence interval (the Mann-Whitney inversion; the tests themselves are in
:mod:`bench.stats.ranktests`, the verdict rules here). A cell is a

* ``regression`` when the slowdown is significant (p < alpha) and the threshold lies inside or
  below its interval, i.e. the data are consistent with a slowdown of at least the threshold;
* ``noisy`` when the interval is wider than the threshold (the pair cannot resolve a change of
  that size) and the slowdown is not beyond the threshold outright; the row says how many samples
  would resolve it;
* ``incomparable`` when the two measurements are of different things (precision, GPU model,
  torch / NCCL version, workload dimensions).

Why "inside or below" rather than "the estimate is above": a true slowdown of exactly the
threshold then fails with probability >= 1 - alpha/2 whenever the cell is not noisy, while an
A/A pair fails with probability <= alpha/2 (docs/guides/regression-gate.md; python -m tools.calibrate measures it).

That bound holds for samples that vary like the runs being compared. Per-step samples of one run
a side see within-run noise only, not the drift between two runs of the same code, which on a
shared machine is larger (python -m tools.calibrate: 24-38% of real CPU A/A pairs failed that way);
such rows say so. Against a history, CURRENT is tested against the per-run medians (unit "runs",
:func:`run_test`), whose spread is that drift.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from bench.core import knobs
from bench.core.errors import UserError
from bench.core.spec import ONE_RANK_SKIP
from bench.gate.samples import MIN_REPEATS, Samples, cell_samples
from bench.results.columns import key_columns
from bench.stats.ranktests import ALPHA, min_samples, run_test, runs_needed, samples_needed, shift_test

KEY = ["workload", "strategy", "backend", "device", "world_size"]
OPTIONAL_KEY = ["mesh", "micro_batches", "schedule"]
#: verdicts that fail a CI job
FAILING = ("regression", "broken")
#: verdicts that mean "these two cells were measured against each other"
COMPARED = ("regression", "improvement", "same", "noisy", "broken", "fixed")
#: workload dimensions that must match for step times to be comparable
DIMENSIONS = ("precision", "params", "flops_per_sample", "global_batch", "gpu_name")
#: what makes each difference go away, after "measure both sides " (the incomparable row's note and
#: the one-line error of a pair with nothing comparable name the difference, then this)
FIXES = {
    "torch": "with one torch", "nccl": "with one NCCL", "GPUs": "on one GPU model", "gpu_name": "on one GPU model",
    "precision": "with one --precision", "global_batch": "with one global batch (--global-batch)",
    "params": "with one workload definition (the same --workloads and parbench)",
    "flops_per_sample": "with one workload definition (the same --workloads and parbench)",
    "settings": "with the same strategy settings (--option), or keep this pair as a new baseline",
    "training": "with the same training knobs (--optimizer, --compile, --ac), or keep this pair as a new baseline",
}


def parse_threshold(text: str) -> float:
    """'5%' or '5' or '0.05' -> 0.05 (a fraction)."""
    t = str(text).strip()
    try:
        v = float(t.rstrip("%"))
    except ValueError:
        raise UserError(f"threshold {text!r} is not a number; e.g. --threshold 5%") from None
    if not t.endswith("%") and v >= 1:  # "1" is 1%? "0.999" 99.9%? say it with a unit instead
        raise UserError(f"threshold {text!r} is ambiguous; write it as a percentage ({v:g}%) or a fraction "
                        f"({v / 100:g})")
    frac = v / 100 if t.endswith("%") else v
    if not 0 < frac < 1:
        raise UserError(f"threshold {text!r} must be between 0% and 100%; e.g. --threshold 5%")
    return frac


def decide(r: dict, threshold: float, alpha: float = ALPHA) -> tuple[str, str]:
    """(verdict, note) for one tested cell; see the module docstring for the rule."""
    sig = r["p_value"] < alpha
    s, lo, hi, width = r["shift"], r["shift_low"], r["shift_high"], r["noise_floor"]
    if sig and lo > threshold:
        return "regression", f"slower by {s:+.1%}, all of [{lo:+.1%}, {hi:+.1%}] past the threshold"
    if sig and hi < -threshold:
        return "improvement", ""
    if not width <= threshold:
        return "noisy", f"noise floor {width:.1%} is above the threshold {threshold:.1%}"
    if sig and s > 0 and hi >= threshold:
        return "regression", f"slower by {s:+.1%} (p={r['p_value']:.2g}), interval reaches the threshold"
    if sig and s < 0 and lo <= -threshold:
        return "improvement", ""
    return "same", ""


def run_context(meta: dict[str, Any] | None) -> dict[str, Any]:
    """The run-level facts that make step times comparable: torch, NCCL, the GPU models."""
    meta = meta or {}
    gpus = meta.get("gpus")  # a list; a history entry written by hand may hold anything
    return {"torch": meta.get("torch"), "nccl": meta.get("nccl"),
            "gpus": (", ".join(sorted(set(map(str, gpus)))) if isinstance(gpus, list) else str(gpus)) if gpus else None}


def explain(diffs: list[tuple[str, str]], limit: int = 3) -> str:
    """What differs and how to fix it, in one line: ``diffs`` are (kind, text) pairs, kind a key of
    FIXES; e.g. 'torch 2.11.0+cu130 vs 2.13.0: measure both sides with one torch'."""
    texts = list(dict.fromkeys(text for _, text in diffs))
    shown = "; ".join(texts[:limit]) + (f"; and {len(texts) - limit} more" if len(texts) > limit else "")
    fixes = list(dict.fromkeys(FIXES.get(kind, "with one setup") for kind, _ in diffs))
    how = fixes[0] if len(fixes) == 1 else ", ".join(fixes[:-1]) + " and " + fixes[-1]
    return f"{shown}: measure both sides {how}"


def _differs(a: Any, b: Any) -> bool:
    """Both known and not equal (numbers to 1e-9 relative)."""
    if a is None or b is None or (isinstance(a, float) and math.isnan(a)) or pd.isna(a) or pd.isna(b):
        return False
    try:
        fa, fb = float(a), float(b)
        return not math.isclose(fa, fb, rel_tol=1e-9)
    except (TypeError, ValueError):
        return str(a) != str(b)


def _check_inputs(base: pd.DataFrame, cur: pd.DataFrame, key: list[str]) -> None:
    """The errors that would otherwise make a comparison of nothing look like a pass."""
    for name, df in (("BASE", base), ("CURRENT", cur)):
        if "throughput_samples_s" not in df.columns:
            raise UserError(f"{name} run has no throughput_samples_s column; pass a run written by parbench run")
    for k in key:
        a, b = base[k].dropna(), cur[k].dropna()
        if len(a) and len(b) and pd.api.types.is_numeric_dtype(a) != pd.api.types.is_numeric_dtype(b):
            raise UserError(f"key column {k!r} is {a.dtype} in BASE but {b.dtype} in CURRENT; "
                            "re-record the older run with this parbench version")


def _norm_key(s: pd.Series) -> pd.Series:
    """Key values as strings that match across dtypes: 8, 8.0 and '8' are all '8'."""
    if pd.api.types.is_numeric_dtype(s):
        return s.map(lambda v: "" if pd.isna(v) else f"{float(v):g}").astype("string")
    return s.astype("string").fillna("")


def _ci_fallback(b: pd.Series, c: pd.Series, threshold: float) -> tuple[str, str]:
    """No step samples on one side: judge from the recorded median intervals, conservatively."""
    try:
        lo_b, hi_b = float(b["step_time_ci_low_s"]), float(b["step_time_ci_high_s"])
        lo_c, hi_c = float(c["step_time_ci_low_s"]), float(c["step_time_ci_high_s"])
    except (KeyError, TypeError, ValueError):
        return "noisy", "no step samples and no intervals: nothing to test"
    if not all(np.isfinite([lo_b, hi_b, lo_c, hi_c])):
        return "noisy", "no step samples and no intervals: nothing to test"
    note = "no step samples: judged from the recorded intervals"
    if lo_c > hi_b * (1 + threshold):
        return "regression", note
    if hi_c * (1 + threshold) < lo_b:
        return "improvement", note
    return "same", note


#: the step-time slowdown that fails when none is given
DEFAULT_THRESHOLD = "5%"


@dataclass(frozen=True, kw_only=True)
class Gate:
    """What turns a comparison into verdicts; the defaults are ``parbench compare``'s."""

    threshold: float = parse_threshold(DEFAULT_THRESHOLD)
    alpha: float = ALPHA
    test: str = "mannwhitneyu"
    # a cell measured once a side is at most noisy: one run's steps do not show run-to-run drift
    require_repeats: bool = True
    # with a history: a regression on fewer runs than this is reported as noisy
    fail_from_runs: int = 0
    min_repeats: int = MIN_REPEATS


@dataclass(frozen=True)
class Side:
    """One side of a comparison: a run's cells with its steps and meta.json, or a history's
    stable values, whose per-run medians (``samples``) stand in for the steps."""

    cells: pd.DataFrame
    steps: pd.DataFrame | None = None
    meta: Mapping[str, Any] | None = None
    samples: dict[int, Samples] | None = None

    @classmethod
    def of(cls, run: Any) -> Side:
        """A :class:`bench.results.run.Run` (or its ``cells, steps, meta``), or a Side as it is."""
        if isinstance(run, Side):
            return run
        cells, steps, meta = run
        return cls(cells, steps, meta)


def compare(base: Any, cur: Any, gate: Gate | None = None) -> pd.DataFrame:
    """One row per cell present in either run; raises UserError when nothing could be compared.

    Columns: the key columns, ``base_status``, ``cur_status``, ``base_tput``, ``cur_tput``,
    ``change`` (throughput, negative is slower), ``base_time_s`` / ``cur_time_s`` (median step
    time of the samples, else of the cell), ``median_change`` (their ratio - 1), ``shift`` /
    ``shift_low`` / ``shift_high`` (the Hodges-Lehmann shift of step time: the median of CURRENT /
    BASE over every pair of samples - 1, positive is slower, with its 1-alpha interval; it differs
    from ``median_change`` when the samples spread), ``p_value``, ``noise_floor``,
    ``n_base``, ``n_cur``, ``unit`` (what a sample is), ``needed`` (samples a side that would
    resolve a noisy cell), ``verdict``, ``note``,
    ``ci_overlap`` (whether the two medians' intervals overlap; shown, never the verdict).

    ``base`` and ``cur`` are :class:`Side` values or runs. ``gate.require_repeats``: a cell tested on
    one run's steps a side is at most ``noisy``, since that test cannot see run-to-run drift.
    ``gate.fail_from_runs``: against a history whose stable segment holds fewer runs than this (so
    its runs' samples were pooled, not tested against their run-to-run spread), a cell is at most
    ``noisy`` too (a CI gate's first runs after a new baseline).
    """
    gate = gate or Gate()
    bside, cside = Side.of(base), Side.of(cur)
    base, cur = bside.cells, cside.cells
    # The cell's identity comes from the metric registry: core keys and every strategy label and
    # option column both runs have (a cell run with other settings is another cell).

    key = [c for c in key_columns(set(base.columns) & set(cur.columns)) if c in base.columns and c in cur.columns]
    key = KEY + [c for c in key if c not in KEY]
    # Weak scaling plans one single-device cell per global batch: then the batch is part of the key.
    if "global_batch" in base and "global_batch" in cur and (base.duplicated(key).any() or cur.duplicated(key).any()):
        key.append("global_batch")
    _check_inputs(base, cur, key)
    extra = [c for c in ("cell_id", "status", "reason", "parity_ok", "throughput_samples_s", "step_time_median_s",
                         "step_time_ci_low_s", "step_time_ci_high_s", *DIMENSIONS, *LOAD) if c not in key]
    b = base.reindex(columns=key + extra).drop_duplicates(key).copy()
    c = cur.reindex(columns=key + extra).drop_duplicates(key).copy()
    for df in (b, c):
        for k in key:
            df[k] = _norm_key(df[k])
    m = b.merge(c, on=key, how="outer", suffixes=("_b", "_c"), indicator=True)
    ctx_b, ctx_c = run_context(bside.meta), run_context(cside.meta)
    pairing = _Pairing(
        base=bside.samples if bside.samples is not None else cell_samples(bside.steps, gate.min_repeats),
        cur=cell_samples(cside.steps, gate.min_repeats), ctx_b=ctx_b, ctx_c=ctx_c, gate=gate,
        run_diff=[(k, f"{k} {ctx_b[k]} vs {ctx_c[k]}") for k in ("torch", "nccl") if _differs(ctx_b[k], ctx_c[k])])
    rows = []
    for _, r in m.iterrows():
        row: dict[str, Any] = {k: r[k] for k in key}
        row.update(base_status=r["status_b"], cur_status=r["status_c"],
                   base_tput=pd.to_numeric(r["throughput_samples_s_b"], errors="coerce"),
                   cur_tput=pd.to_numeric(r["throughput_samples_s_c"], errors="coerce"))
        row["change"] = row["cur_tput"] / row["base_tput"] - 1 if row["base_tput"] else np.nan
        lo_b, hi_b, lo_c, hi_c = (pd.to_numeric(r[f"step_time_ci_{x}_s_{y}"], errors="coerce")
                                  for y in ("b", "c") for x in ("low", "high"))
        row["ci_overlap"] = bool(lo_c <= hi_b and lo_b <= hi_c)  # shown beside the verdict, never deciding it
        row["base_time_s"] = pd.to_numeric(r["step_time_median_s_b"], errors="coerce")
        row["cur_time_s"] = pd.to_numeric(r["step_time_median_s_c"], errors="coerce")
        row["verdict"], row["note"] = _verdict(r, row, pairing)
        row["verdict"], row["note"] = _trusted(row, load_difference(r), gate)
        rows.append(row)
    out = pd.DataFrame(rows)
    for col in ("shift", "shift_low", "shift_high", "p_value", "noise_floor", "n_base", "n_cur", "needed", "unit"):
        if col not in out:
            out[col] = np.nan
    out = _pair_changed_settings(out, key)
    out["median_change"] = _num(out["cur_time_s"]) / _num(out["base_time_s"]) - 1  # beside the shift, not it
    if not out["verdict"].isin(COMPARED).any():
        raise UserError(_nothing_compared(out, key))
    return out.drop(columns="_diffs", errors="ignore").sort_values(key).reset_index(drop=True)


def _trusted(row: dict, loads: str, gate: Gate) -> tuple[str, str]:
    """A regression or improvement the evidence cannot carry, as noisy with why: the two sides
    measured under different loads (``loads``), one run's steps a side (``require_repeats``), or the
    pooled samples of a history shorter than ``fail_from_runs``; the row's verdict otherwise."""
    verdict, note = row["verdict"], row["note"]
    if verdict not in ("regression", "improvement"):
        return verdict, note
    if loads:
        return "noisy", (f"{verdict} measured under different loads, not trusted: {loads}; measure both sides on a "
                         "quiet machine")
    if gate.require_repeats and row.get("unit") == "steps":
        return "noisy", (f"{verdict} on one run's steps a side, not trusted (default; --single-run to allow it): "
                         f"record >= {min_samples(gate.alpha)} repeats or compare --history")
    few = row.get("history_runs")
    if gate.fail_from_runs and few is not None and few < gate.fail_from_runs:
        return "noisy", (f"{verdict} on the pooled samples of {few} history run(s), not trusted: this gate decides "
                         f"from {gate.fail_from_runs} runs (--fail-from-runs); {note}")
    return verdict, note


#: the columns that say how busy the machine was while a cell was measured (the telemetry's)
LOAD = ("contended", "host_other_cpu_cores")
#: cores busy outside the benchmark whose difference between the two sides makes a verdict untrustworthy
LOAD_CORES = 0.5


def load_difference(r: pd.Series) -> str:
    """How the two sides of a merged row were measured under different loads ('' if alike, or not
    known): one side contended and the other not, or LOAD_CORES more cores busy outside the
    benchmark on one side. A shift between them is the machine's as much as the code's. Only sides
    that both carry telemetry are weighed (a run with --sample-hz 0, or a history, did not measure
    its load: "not contended" would be a guess)."""
    def text(v: Any) -> str:
        return "" if v is None or (not isinstance(v, str) and pd.isna(v)) else str(v)

    ob, oc = (pd.to_numeric(r.get(f"host_other_cpu_cores_{s}"), errors="coerce") for s in ("b", "c"))
    if pd.isna(ob) or pd.isna(oc):
        return ""
    cb, cc = text(r.get("contended_b")), text(r.get("contended_c"))
    busy = abs(float(oc) - float(ob)) >= LOAD_CORES
    if bool(cb) == bool(cc) and not busy:
        return ""
    cores = f"{float(ob):.1f} vs {float(oc):.1f} cores busy outside the benchmark"
    sides = f"BASE {cb or 'not contended'}, CURRENT {cc or 'not contended'}" if bool(cb) != bool(cc) else ""
    return "; ".join(x for x in (cores, sides) if x)


def _num(s: pd.Series) -> pd.Series:
    return pd.to_numeric(s, errors="coerce")


@dataclass(frozen=True)
class _Pairing:
    """What every merged row of one comparison is judged with: each side's samples by cell id, the
    runs' contexts, the differences of the runs themselves, and the gate."""

    base: dict[int, Samples]
    cur: dict[int, Samples]
    ctx_b: dict[str, Any]
    ctx_c: dict[str, Any]
    run_diff: list[tuple[str, str]]
    gate: Gate


def _verdict(r: pd.Series, row: dict, pairing: _Pairing) -> tuple[str, str]:
    """The verdict of one merged row; fills the test's columns into ``row`` (an incomparable row's
    differences, (kind, text) pairs, into ``_diffs``)."""
    bs, cs, run_diff, ctx_b, ctx_c = pairing.base, pairing.cur, pairing.run_diff, pairing.ctx_b, pairing.ctx_c
    threshold, alpha, test = pairing.gate.threshold, pairing.gate.alpha, pairing.gate.test
    if r["_merge"] == "right_only":
        return "new", ""
    if r["_merge"] == "left_only":
        return "missing", ""
    ok_b, ok_c = r["status_b"] == "ok", r["status_c"] == "ok"
    if ok_b and r["status_c"] == "skipped" and str(r.get("reason_c", "")).startswith(ONE_RANK_SKIP):
        # the matrix no longer runs it (one rank, measured under another backend): not a breakage
        return "missing", "no longer in the matrix: " + str(r["reason_c"])
    if ok_b and not ok_c:
        return "broken", f"now {r['status_c']}"
    if not ok_b:
        return ("fixed", "") if ok_c else ("not run", "")
    # A cell that trains another model than one device is broken however fast it got.
    par_b, par_c = r.get("parity_ok_b"), r.get("parity_ok_c")
    was_ok = par_b is None or pd.isna(par_b) or bool(par_b)
    if par_c is not None and not pd.isna(par_c) and not bool(par_c) and was_ok:
        return "broken", "parity with one device failed"
    diffs = list(run_diff)
    for dim in DIMENSIONS:
        if f"{dim}_b" not in r:  # part of the key (weak scaling's global batch): equal by construction
            continue
        if _differs(r[f"{dim}_b"], r[f"{dim}_c"]):
            diffs.append((dim, f"{dim} {r[f'{dim}_b']} vs {r[f'{dim}_c']}"))
    if pd.isna(r["gpu_name_b"]) or pd.isna(r["gpu_name_c"]):  # no per-cell model: the run's GPUs
        if _differs(ctx_b["gpus"], ctx_c["gpus"]):
            diffs.append(("GPUs", f"GPUs {ctx_b['gpus']} vs {ctx_c['gpus']}"))
    if diffs:
        row["_diffs"] = diffs
        return "incomparable", explain(diffs)
    sb = bs.get(int(r["cell_id_b"])) if pd.notna(r["cell_id_b"]) else None
    sc = cs.get(int(r["cell_id_c"])) if pd.notna(r["cell_id_c"]) else None
    if sb is None or sc is None or len(sb.values) < 2 or len(sc.values) < 2:
        return _ci_fallback(r.rename(lambda x: x[:-2] if x.endswith("_b") else x),
                            r.rename(lambda x: x[:-2] if x.endswith("_c") else x), threshold)
    if sb.unit == "runs":  # a history's per-run medians: CURRENT's runs (repeats) against them
        cur_runs = sc.values if sc.unit == "repeats" else np.array([np.median(sc.values)])
        t = run_test(sb.values, cur_runs, alpha)
        row.update(t, unit="runs", base_time_s=float(np.median(sb.values)), cur_time_s=float(np.median(cur_runs)))
        verdict, note = decide(t, threshold, alpha)
        if verdict == "noisy":
            need = runs_needed(sb.values, threshold, alpha)
            row["needed"] = need
            spread = float(np.std(np.log(sb.values), ddof=1))
            note += (f"; a history of about {need} runs would resolve it" if need else
                     f"; its {len(sb.values)} runs differ by ~{spread:.0%} run to run, more than this threshold "
                     "can resolve on this machine")
        return verdict, note
    verdict, note = _pooled_verdict(row, sb, sc, threshold, alpha, test)
    if sb.runs is not None:  # a history too short for run_test: its runs' samples were pooled
        row["history_runs"] = sb.runs
        note = (note + "; " if note else "") + (f"the history's stable segment holds {sb.runs} run(s), too few "
                                                f"to test against its run-to-run noise: its {sb.unit} pooled")
    return verdict, note


def _pooled_verdict(row: dict, sb: Samples, sc: Samples, threshold: float, alpha: float,
                    test: str) -> tuple[str, str]:
    """Rank test of BASE's samples against CURRENT's (repeats or steps); fills ``row``."""
    # Repeats on one side only: compare like with like, steps against steps.
    if sb.unit != sc.unit:
        return "noisy", f"BASE has {sb.unit}, CURRENT {sc.unit}: record both with the same repeats"
    t = shift_test(sb.values, sc.values, alpha, test)
    row.update(t, unit=sb.unit, base_time_s=float(np.median(sb.values)), cur_time_s=float(np.median(sc.values)))
    verdict, note = decide(t, threshold, alpha)
    if not np.isfinite(t["noise_floor"]):
        # Too few samples for any interval at this level: say that, not "[-100%, inf]" and "inf%".
        row.update(shift_low=np.nan, shift_high=np.nan, noise_floor=np.nan)
        note = (f"{min(len(sb.values), len(sc.values))} {sb.unit} a side cannot bound the interval at the "
                f"{1 - alpha:.0%} level (>= {min_samples(alpha)} needed)")
    if verdict == "noisy":
        need = samples_needed(sb.values, sc.values, t["noise_floor"], threshold, alpha)
        row["needed"] = need
        if sb.unit == "repeats":
            note += f"; about {need} repeats a side would resolve it"
        else:
            note += (f"; about {need} timed steps a side would resolve the within-run noise, "
                     f">= {min_samples(alpha)} repeats the run-to-run drift")
    elif sb.unit == "steps" and verdict in ("regression", "improvement"):
        # One run a side: the steps show within-run noise only; two runs of the same code can differ
        # by more than that (python -m tools.calibrate measures the A/A rate).
        note = (note + "; " if note else "") + "one run a side: run-to-run drift is not in this test"
    return verdict, note


def _pair_changed_settings(out: pd.DataFrame, key: list[str]) -> pd.DataFrame:
    """A cell missing from CURRENT and a new one with the same workload, strategy, backend, device
    and world size, one of each, are one cell whose settings changed (an option, the mesh, the
    micro-batches): one ``incomparable`` row that names what changed and keeps both times, not a
    `missing` and a `new` row that leave the reader to find the pair."""
    extra = [k for k in key if k not in KEY]
    if not extra or out.empty:
        return out
    drop, add = [], []
    for _, grp in out[out["verdict"].isin(["missing", "new"])].groupby(KEY, dropna=False, sort=False):
        miss, new = grp[grp["verdict"] == "missing"], grp[grp["verdict"] == "new"]
        if len(miss) != 1 or len(new) != 1:
            continue
        a, b = miss.iloc[0], new.iloc[0]
        if "global_batch" in extra and str(a["global_batch"]) != str(b["global_batch"]):
            continue  # weak scaling's reference cells of other batches: other cells, not other settings
        changed = [f"{k} {a[k]} -> {b[k]}" for k in extra if str(a[k]) != str(b[k])]
        row = a.to_dict()
        for k in extra:
            row[k] = b[k]
        for col in ("cur_status", "cur_tput", "cur_time_s"):
            row[col] = b[col]
        row["change"] = row["cur_tput"] / row["base_tput"] - 1 if row["base_tput"] else np.nan
        kind = "training" if all(k in knobs.NAMES for k in extra if str(a[k]) != str(b[k])) else "settings"
        row["_diffs"] = [(kind, f"{'training' if kind == 'training' else 'settings'} differ: " + ", ".join(changed))]
        row["verdict"], row["note"] = "incomparable", explain(row["_diffs"])
        drop += [miss.index[0], new.index[0]]
        add.append(row)
    if not add:
        return out
    return pd.concat([out.drop(index=drop), pd.DataFrame(add)], ignore_index=True)


def _nothing_compared(out: pd.DataFrame, key: list[str]) -> str:
    """The one-line error for a comparison that compared nothing, naming why."""
    shared = out[~out["verdict"].isin(["new", "missing"])]
    if shared.empty:
        return ("the two runs share no cell (same workload, strategy, backend, device, world size); "
                "compare runs of the same matrix")
    inc = shared[shared["verdict"] == "incomparable"]
    if not inc.empty:  # every difference of every cell, deduplicated, and what makes them go away
        diffs = [d for ds in inc.get("_diffs", pd.Series(dtype=object)) if isinstance(ds, list) for d in ds]
        return "incomparable: " + (explain(diffs) if diffs else str(inc["note"].iloc[0]))
    return "no shared cell ran in both runs (all skipped or failed); fix the runs, then compare"


def failed(table: pd.DataFrame) -> bool:
    """True when a cell got significantly slower past the threshold or stopped running."""
    return bool(table["verdict"].isin(FAILING).any())
