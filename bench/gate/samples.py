"""What a comparison tests: a cell's samples of step time, from the steps table of a run.

A step's time is its slowest rank's. With >= ``MIN_REPEATS`` repeats a cell's samples are its
per-repeat medians (they vary as runs do); with fewer, its per-step times (they see within-run
noise only: :mod:`bench.gate.compare` says so in the verdict).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

#: repeats needed before per-repeat medians replace per-step times as the samples
MIN_REPEATS = 3  # repeats are the samples from 3 on; a verdict past noisy needs min_samples() = 5 a side


@dataclass(frozen=True)
class Samples:
    """The samples of one cell: step times in seconds, and what one sample is."""

    values: np.ndarray
    unit: str  # "repeats", "steps", or "runs" (per-run medians of a history, one value per run)
    runs: int | None = None  # a history's baseline: how many runs the values came from


def step_times(steps: pd.DataFrame) -> pd.DataFrame:
    """Timed steps, one row per (cell_id, [repeat,] step): the slowest rank's time is the step's."""
    if steps is None or steps.empty or "step_time_s" not in steps:
        return pd.DataFrame(columns=["cell_id", "repeat", "step", "step_time_s"])
    s = steps[steps["phase"] == "timed"] if "phase" in steps else steps
    by = ["cell_id", "repeat", "step"] if "repeat" in s else ["cell_id", "step"]
    out = s.groupby(by, dropna=False)["step_time_s"].max().reset_index()
    if "repeat" not in out:
        out["repeat"] = 0
    out = out[np.isfinite(out["step_time_s"].astype(float)) & (out["step_time_s"] > 0)]
    return out


def cell_samples(steps: pd.DataFrame, min_repeats: int = MIN_REPEATS) -> dict[int, Samples]:
    """cell_id -> its samples: per-repeat medians when it has >= min_repeats repeats, else steps."""
    st = step_times(steps)
    out: dict[int, Samples] = {}
    for cid, g in st.groupby("cell_id"):
        per_rep = g.groupby("repeat")["step_time_s"].median()
        if len(per_rep) >= min_repeats:
            out[int(cid)] = Samples(per_rep.to_numpy(float), "repeats")
        else:
            out[int(cid)] = Samples(g["step_time_s"].to_numpy(float), "steps")
    return out
