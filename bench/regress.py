"""Compare two runs cell by cell and give a verdict CI can act on."""

from __future__ import annotations

import numpy as np
import pandas as pd

from bench import UserError

KEY = ["workload", "strategy", "backend", "device", "world_size"]
OPTIONAL_KEY = ["mesh", "micro_batches", "schedule"]


def parse_threshold(text: str) -> float:
    """'5%' or '5' or '0.05' -> 0.05 (a fraction)."""
    t = str(text).strip()
    try:
        v = float(t.rstrip("%"))
    except ValueError:
        raise UserError(f"threshold {text!r} is not a number; e.g. --threshold 5%") from None
    frac = v / 100 if (t.endswith("%") or v >= 1) else v
    if not 0 < frac < 1:
        raise UserError(f"threshold {text!r} must be between 0% and 100%; e.g. --threshold 5%")
    return frac


def compare(base: pd.DataFrame, cur: pd.DataFrame, threshold: float) -> pd.DataFrame:
    """One row per cell present in either run.

    Columns: the key columns, ``base_tput``, ``cur_tput`` (samples/s), ``change`` (fraction,
    negative is slower), ``base_status``, ``cur_status``, ``ci_overlap`` (the two medians' bootstrap
    intervals overlap: the change may be noise), ``verdict`` ('regression', 'improvement', 'same',
    'new', 'missing', 'broken' (ok before, not ok now), 'fixed', 'not run').
    """
    key = KEY + [c for c in OPTIONAL_KEY if c in base.columns and c in cur.columns]
    cols = key + ["status", "throughput_samples_s", "step_time_ci_low_s", "step_time_ci_high_s"]
    b = base.reindex(columns=cols).drop_duplicates(key)
    c = cur.reindex(columns=cols).drop_duplicates(key)
    for df in (b, c):
        for k in key:
            df[k] = df[k].astype("string").fillna("")
    m = b.merge(c, on=key, how="outer", suffixes=("_base", "_cur"), indicator=True)
    out = m[key].copy()
    out["base_status"] = m["status_base"]
    out["cur_status"] = m["status_cur"]
    out["base_tput"] = pd.to_numeric(m["throughput_samples_s_base"], errors="coerce")
    out["cur_tput"] = pd.to_numeric(m["throughput_samples_s_cur"], errors="coerce")
    out["change"] = out["cur_tput"] / out["base_tput"] - 1
    lo_b, hi_b = m["step_time_ci_low_s_base"], m["step_time_ci_high_s_base"]
    lo_c, hi_c = m["step_time_ci_low_s_cur"], m["step_time_ci_high_s_cur"]
    out["ci_overlap"] = (pd.to_numeric(lo_c) <= pd.to_numeric(hi_b)) & (pd.to_numeric(lo_b) <= pd.to_numeric(hi_c))
    verdicts = []
    for (_, r), src in zip(out.iterrows(), m["_merge"]):
        if src == "right_only":
            verdicts.append("new")
        elif src == "left_only":
            verdicts.append("missing")
        elif r["base_status"] == "ok" and r["cur_status"] != "ok":
            verdicts.append("broken")
        elif r["base_status"] != "ok" and r["cur_status"] == "ok":
            verdicts.append("fixed")
        elif r["base_status"] != "ok":
            verdicts.append("not run")
        elif np.isfinite(r["change"]) and r["change"] < -threshold:
            verdicts.append("regression")
        elif np.isfinite(r["change"]) and r["change"] > threshold:
            verdicts.append("improvement")
        else:
            verdicts.append("same")
    out["verdict"] = verdicts
    return out.sort_values(key).reset_index(drop=True)


def failed(table: pd.DataFrame) -> bool:
    """True when a cell got slower past the threshold or stopped running."""
    return bool(table["verdict"].isin(["regression", "broken"]).any())
