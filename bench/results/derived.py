"""The columns that need other cells, computed when a run is read: parity against the
single-device reference and scaling efficiency (:func:`derive`)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from bench.stats.steps import EFFICIENCY_MAX

#: relative tolerance of the parity check, by precision, over the first PARITY_STEPS steps: a
#: legitimate reordering of sums (micro-batches, buckets) differs by float rounding that training
#: then amplifies step after step, so the adaptive loops' longer runs are compared on a fixed horizon
PARITY_TOL = {"fp32": 1e-5, "bf16": 2e-2}
PARITY_STEPS = 25


def global_losses(steps: pd.DataFrame) -> pd.Series:
    """Per (cell_id, step): the global-batch loss, sum over ranks of loss * loss_weight (the first
    repeat: every repeat trains the same batches from the same seed)."""
    s = steps.dropna(subset=["loss"])
    if "repeat" in s:
        s = s[s["repeat"].fillna(0) == 0]
    return (s["loss"] * s["loss_weight"]).groupby([s["cell_id"], s["step"]]).sum()


def derive(cells: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """The columns that need other cells, computed when a run is read: parity against the
    single-device reference that trained the same global batch (same workload, device, precision;
    cells that check their own parity keep their error), and scaling efficiency against the
    reference of the same global batch (strong) or the same batch per device (weak), flagged where
    it cannot be read as a number. Lookups are by key, so reading a run is linear in its cells."""
    cells = cells.copy()
    for col, dtype in (("scaling_efficiency", "float64"), ("scaling_note", "string"), ("parity_rel_err", "float64"),
                       ("parity_tol", "float64"), ("parity_ok", "boolean")):
        if col not in cells:
            cells[col] = pd.Series([None] * len(cells), index=cells.index, dtype="object").astype(dtype)
    if cells.empty or not {"device", "precision", "throughput_samples_s"} <= set(cells.columns):
        return cells  # a run from another tool without them: nothing to derive
    losses = global_losses(steps) if not steps.empty else pd.Series(dtype=float)
    by_cell = {cid: g.droplevel(0) for cid, g in losses.groupby(level=0)} if len(losses) else {}
    ok = cells["status"] == "ok"
    refs = cells[ok & (cells["role"] == "reference")] if "role" in cells else cells.iloc[:0]
    if refs.empty and "strategy" in cells:  # runs written before the role column said so
        refs = cells[ok & (cells["strategy"] == "single")]
    has_gb = "global_batch" in cells
    ref_by: dict[tuple, Any] = {}
    for r in refs.itertuples():
        ref_by.setdefault((r.workload, r.device, r.precision, r.global_batch if has_gb else None), r)
        ref_by.setdefault((r.workload, r.device, r.precision, "any"), r)
    eff, note, err_col, tol_col, ok_col = ({} for _ in range(5))
    for r in cells[ok].itertuples():
        i = r.Index
        tol = PARITY_TOL.get(str(r.precision), 1e-5)
        role = str(getattr(r, "role", ""))
        if role == "independent" and pd.notna(r.parity_rel_err):  # checked its own parity
            tol_col[i], ok_col[i] = tol, bool(r.parity_rel_err <= tol)
        gb = r.global_batch if has_gb and pd.notna(r.global_batch) else None
        weak = str(getattr(r, "scaling", "strong")) == "weak"
        base_gb = gb // r.world_size if (weak and gb is not None) else gb

        def find(batch):
            return ref_by.get((r.workload, r.device, r.precision, batch if batch is not None else "any"))

        scale_ref = find(base_gb)
        tput = getattr(scale_ref, "throughput_samples_s", None) if scale_ref is not None else None
        if tput is not None and pd.notna(tput) and tput > 0 and pd.notna(r.throughput_samples_s):
            e = r.throughput_samples_s / (r.world_size * tput)
            eff[i] = e
            notes = []
            # FSDP's MixedPrecisionPolicy computes in bf16 parameters, the reference in fp32 parameters
            # under autocast (on 2 H100s, gpt-200m at global batch 64, FSDP x2 reaches an efficiency of
            # 1.09; an fsdp_mp=off cell does not separate that from noise).
            if e > EFFICIENCY_MAX:
                own_dtype = getattr(r, "fsdp_param_dtype", None)
                cast = str(r.precision) == "bf16" and isinstance(own_dtype, str) and own_dtype == "bf16"
                why = ("likely the precision: its parameters are bf16 (MixedPrecisionPolicy), the reference's "
                       "fp32 under autocast" if cast else "not physical, noise or a slow reference")
                notes.append(f"efficiency {e:.2f} > {EFFICIENCY_MAX}: {why}")
            stable = getattr(scale_ref, "stable", None)
            if stable is not None and not pd.isna(stable) and not bool(stable):
                notes.append("the single-device reference is not stable")
            if notes:
                note[i] = "; ".join(notes)
        ref = find(gb)
        if ref is None or role == "independent":
            continue
        mine, theirs = by_cell.get(r.cell_id), by_cell.get(ref.cell_id)
        if mine is None or theirs is None:
            continue
        # Adaptive warm-up and timed loops take different numbers of steps; the steps both ran on
        # the same batches are compared.
        common = mine.index.intersection(theirs.index)
        if len(common) == 0 or len(common) < min(len(mine), len(theirs), PARITY_STEPS):
            continue
        common = common[common < PARITY_STEPS]
        a, b = mine.loc[common].to_numpy(), theirs.loc[common].to_numpy()
        err = float(np.max(np.abs(a - b) / np.maximum(np.abs(b), 1e-12)))
        err_col[i], tol_col[i], ok_col[i] = err, tol, bool(err <= tol)
    for col, vals in (("scaling_efficiency", eff), ("scaling_note", note), ("parity_rel_err", err_col),
                      ("parity_tol", tol_col), ("parity_ok", ok_col)):
        if vals:
            cells.loc[list(vals), col] = pd.Series(vals, dtype=cells[col].dtype)
    return cells
