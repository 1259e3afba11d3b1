"""The columns that need other cells, computed when a run is read: parity against the
single-device reference and scaling efficiency (:func:`derive`)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from bench.core import knobs
from bench.results.migrate import roles
from bench.stats.parity import PARITY_STEPS, PARITY_TOL, parity_tol, relative_difference
from bench.stats.steps import EFFICIENCY_MAX

#: how many times its reference's own rounding (``parity_rounding``: the loss difference of the same
#: steps on reversed batches, bench.train.rounding) a cell's losses may differ from one device's:
#: another order of the same sums moves the losses by about that much, and data parallelism splits
#: the sums over ranks as well as reordering them. On CPU (gloo, 2 and 4 ranks, 25 steps; five
#: workloads, seven strategies, SGD and AdamW; python -m tools.parity_rounding, table in
#: docs/evidence/parity-rounding-cpu.csv) a passing strategy's difference reached 95x its
#: reference's rounding (convnet at 2 ranks under SGD: its max-pool and ReLU turn a rounding
#: difference into another choice) and a BatchNorm model's, a difference in semantics, 11,000x and
#: more: the factor sits between them with a margin of about 3x below and 38x above
ROUNDING_FACTOR = 300.0
#: the most the rounding widens a tolerance: a larger difference is the user's to accept (--parity-tol)
ROUNDING_CAP = 1e-3


def cell_tol(r, ref=None) -> float:
    """The tolerance a row's parity is judged by: the one given for it (``parity_tol_set``: the
    flag, or its workload's); else, where its reference ``ref`` measured its rounding,
    :data:`ROUNDING_FACTOR` times that (up to :data:`ROUNDING_CAP`, at least the precision's
    :data:`PARITY_TOL`); else by its precision and optimizer (:func:`parity_tol`)."""
    given = getattr(r, "parity_tol_set", None)
    if given is not None and pd.notna(given) and given > 0:
        return float(given)
    own = getattr(ref, "parity_rounding", None) if ref is not None else None
    if own is not None and pd.notna(own) and own > 0:
        floor = PARITY_TOL.get(str(r.precision), 1e-5)
        return max(floor, min(ROUNDING_FACTOR * float(own), ROUNDING_CAP))
    return parity_tol(str(r.precision), str(getattr(r, "optimizer", "sgd")))


def parity_failure(r) -> str:
    """Why a row's parity failed, in one clause: its largest difference, the step, the tolerance and
    how to set it; BatchNorm named where the cell splits the batch over ranks (its statistics then
    differ from one device's by design, not by rounding)."""
    def num(key: str, spec: str) -> str:
        v = r.get(key)
        return "?" if v is None or pd.isna(v) else format(v, spec)

    step = r.get("parity_step")
    text = (f"parity with one device failed: rel err {num('parity_rel_err', '.1e')}"
            + ("" if step is None or pd.isna(step) else f" at step {int(step)}")
            + f" > tolerance {num('parity_tol', '.2g')} (--parity-tol or the workload's parity_tol sets it)")
    norm, world = r.get("batch_norm"), r.get("world_size")
    splits = r.get("strategy") != "tensor"  # tensor parallelism gives every rank the whole batch
    if isinstance(norm, str) and norm and splits and world is not None and pd.notna(world) and world > 1:
        text += (f"; the model has {norm}: each rank normalises over its share of the batch, one device over all of "
                 "it (a difference in semantics, not rounding): torch.nn.SyncBatchNorm.convert_sync_batchnorm in the "
                 "factory compares like with like")
    return text


def _training_key(r) -> tuple:
    return tuple(getattr(r, name, None) for name in knobs.NAMES)


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
    cells = _with_derived_columns(cells.copy())
    roles(cells)  # rows written before the role column: their strategy's declared role
    if cells.empty or not {"device", "precision", "throughput_samples_s"} <= set(cells.columns):
        return cells  # a run from another tool without them: nothing to derive
    losses = global_losses(steps) if not steps.empty else pd.Series(dtype=float)
    by_cell = {cid: g.droplevel(0) for cid, g in losses.groupby(level=0)} if len(losses) else {}
    ok = cells["status"] == "ok"
    refs = cells[ok & (cells["role"] == "reference")] if "role" in cells else cells.iloc[:0]
    has_gb = "global_batch" in cells
    ref_by: dict[tuple, Any] = {}
    for r in refs.itertuples():
        ref_by.setdefault((r.workload, r.device, r.precision, _training_key(r), r.global_batch if has_gb else None), r)
        ref_by.setdefault((r.workload, r.device, r.precision, _training_key(r), "any"), r)
    policy_refs = _policy_references(cells[ok], has_gb)
    eff, note, unphysical, err_col, tol_col, ok_col, step_col = ({} for _ in range(7))
    for r in cells[ok].itertuples():
        i = r.Index
        role = str(getattr(r, "role", ""))
        if role == "independent" and pd.notna(r.parity_rel_err):  # checked its own parity
            tol = cell_tol(r)
            tol_col[i], ok_col[i] = tol, bool(r.parity_rel_err <= tol)
        gb = r.global_batch if has_gb and pd.notna(r.global_batch) else None
        weak = str(getattr(r, "scaling", "strong")) == "weak"
        base_gb = gb // r.world_size if (weak and gb is not None) else gb

        def find(batch):
            return ref_by.get((r.workload, r.device, r.precision, _training_key(r),
                               batch if batch is not None else "any"))

        scale_ref, policy_note = _scale_reference(r, find(base_gb), policy_refs, base_gb)
        tput = getattr(scale_ref, "throughput_samples_s", None) if scale_ref is not None else None
        if tput is not None and pd.notna(tput) and tput > 0 and pd.notna(r.throughput_samples_s):
            e = r.throughput_samples_s / (r.world_size * tput)
            eff[i] = e
            text, unphysical[i] = _scaling_note(r, e, scale_ref, policy_note)
            if text:
                note[i] = text
        ref = find(gb)
        if ref is None or role == "independent":
            continue
        tol = cell_tol(r, ref)
        mine, theirs = by_cell.get(r.cell_id), by_cell.get(ref.cell_id)
        if mine is None or theirs is None:
            continue
        # Adaptive warm-up and timed loops take different numbers of steps; the steps both ran on
        # the same batches are compared.
        common = mine.index.intersection(theirs.index)
        if len(common) == 0 or len(common) < min(len(mine), len(theirs), PARITY_STEPS):
            continue
        common = common[common < PARITY_STEPS]
        rel = relative_difference(mine.loc[common].to_numpy(), theirs.loc[common].to_numpy())
        err = float(np.max(rel))
        err_col[i], tol_col[i], ok_col[i], step_col[i] = err, tol, bool(err <= tol), int(common[int(np.argmax(rel))])
    for col, vals in (("scaling_efficiency", eff), ("scaling_note", note), ("scaling_unphysical", unphysical),
                      ("parity_rel_err", err_col), ("parity_tol", tol_col), ("parity_ok", ok_col),
                      ("parity_step", step_col)):
        if vals:
            cells.loc[list(vals), col] = pd.Series(vals, dtype=cells[col].dtype)
    return cells


def _scaling_note(r, e: float, scale_ref, policy_note: str | None) -> tuple[str, bool]:
    """(why a cell's scaling efficiency ``e`` is not to be read as a number, '' when it is; whether
    it is not physical: above EFFICIENCY_MAX with nothing to explain it)."""
    notes = []
    unphysical = False
    # FSDP's MixedPrecisionPolicy computes in bf16 parameters, the reference in fp32 parameters
    # under autocast (on 2 H100s, gpt-200m at global batch 64, FSDP x2 reaches an efficiency of
    # 1.09; an fsdp_mp=off cell does not separate that from noise).
    if e > EFFICIENCY_MAX:
        own_dtype = getattr(r, "fsdp_param_dtype", None)
        cast = str(r.precision) == "bf16" and isinstance(own_dtype, str) and own_dtype == "bf16"
        why = ("likely the precision: its parameters are bf16 (MixedPrecisionPolicy), the reference's "
               "fp32 under autocast" if cast else "not physical, noise or a slow reference")
        notes.append(f"efficiency {e:.2f} > {EFFICIENCY_MAX}: {why}")
        unphysical = not cast
    stable = getattr(scale_ref, "stable", None)
    if stable is not None and not pd.isna(stable) and not bool(stable):
        notes.append("the single-device reference is not stable")
    if policy_note:
        notes.append(policy_note)
    return "; ".join(notes), unphysical


def _with_derived_columns(cells: pd.DataFrame) -> pd.DataFrame:
    """``cells`` with the derived columns present (empty where there is nothing to derive)."""
    for col, dtype in DERIVED:
        if col not in cells:
            cells[col] = pd.Series([None] * len(cells), index=cells.index, dtype="object").astype(dtype)
    return cells


DERIVED = (("scaling_efficiency", "float64"), ("scaling_note", "string"), ("scaling_unphysical", "boolean"),
           ("parity_rel_err", "float64"),
           ("parity_tol", "float64"), ("parity_ok", "boolean"), ("parity_step", "Int64"))


def _policy(r) -> str:
    p = getattr(r, "precision_policy", None)
    return "" if p is None or pd.isna(p) else str(p)


def _policy_references(ok: pd.DataFrame, has_gb: bool) -> dict[tuple, Any]:
    """One-device cells that train under another precision policy than the single-device
    reference (FSDP2 at world size 1 with bf16 parameters), by (workload, device, precision,
    training, policy, global batch): the reference a cell of that policy is scaled against."""
    out: dict[tuple, Any] = {}
    if "precision_policy" not in ok:
        return out
    for r in ok[ok["world_size"] == 1].itertuples():
        if str(getattr(r, "role", "")) == "reference" or not _policy(r):
            continue
        out.setdefault((r.workload, r.device, r.precision, _training_key(r), _policy(r),
                        r.global_batch if has_gb else None), r)
    return out


def _scale_reference(r, single, policy_refs: dict[tuple, Any], batch) -> tuple[Any, str | None]:
    """The reference ``r``'s scaling efficiency is read against: the single-device reference when
    it trains under ``r``'s precision policy, else a one-device cell of that policy when one was
    measured, else the single-device reference with a note naming the difference."""
    if single is None or not _policy(r) or _policy(r) == _policy(single):
        return single, None
    same = policy_refs.get((r.workload, r.device, r.precision, _training_key(r), _policy(r), batch))
    if same is not None and same.Index != r.Index:
        return same, None
    return single, (f"precision policy {_policy(r)} vs the reference's {_policy(single)}: part of the speed-up is "
                    "the precision")
