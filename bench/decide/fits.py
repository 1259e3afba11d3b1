"""What fits: the memory side of a recommendation, from the memory model's columns of the cells
table (:mod:`bench.core.memory`: ``mem_pred_*``, ``mem_batch_fits``, ``mem_capacity_bytes``).

A cell's predicted footprint is read back from its row (:func:`footprint`), or, for a cell the
planner skipped and whose row carries no prediction, from the skip's reason (the planner writes its
predicted peak, the components over 0.05 GiB, the capacity and the largest micro-batch that fits).
For a workload that fits nowhere in the matrix, :func:`changes` predicts the peak of each change that
would make the cell nearest to fitting fit: the optimizer state sharded over its devices (optimizer /
n), activation checkpointing (the run's own prediction of the same cell at ``--ac full``, else the
share of the peak that is activations: no number is made up), a smaller batch (the largest
micro-batch predicted to fit) and the model cut over more devices (fsdp: parameters, gradients and
state / n, activations at the smaller micro-batch). Everything here is arithmetic on the table; the
sentences are :mod:`reports.words`'.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pandas as pd

from bench.core import knobs
from bench.core.memory import MARGIN
from bench.decide.decision import (
    Change,
    ChangeKind,
    Decision,
    DecisionKind,
    Excluded,
    ExcludedKind,
    Fit,
    Ground,
    OomKind,
)
from bench.decide.rules import capacity_from, is_reference, num, oom_kind, ran_out, text

GIB = 2**30
#: the parts of the allocated peak, in the order the report stacks them
PARTS = ("params", "optimizer", "grads", "activations", "buffers", "data", "other")
#: strategies whose fullest device already holds only a share of the optimizer state
SHARDS_STATE = ("fsdp", "ddp-zero1")
#: the most devices a change to more devices is predicted for
MOST_DEVICES = 1024

_PEAK = re.compile(r"predicted peak ([0-9.]+) GiB( at least)? \(([^)]*)\) > ([0-9.]+) GiB")
_BATCH = re.compile(r"at most (\d+) samples per device would fit \(this cell: (\d+)\)")


@dataclass(frozen=True, kw_only=True)
class Footprint:
    """A cell's predicted peak (bytes) by component, as its row (or the planner's reason) states it.
    ``grads`` are every gradient (at the optimizer step's peak); ``activations`` None: not probed."""

    params: float
    grads: float
    optimizer: float
    activations: float | None
    buffers: float
    data: float
    allocated: float
    at: str  # "backward" or "optimizer step"
    reserved_ratio: float = 1.0  # predicted reserved over allocated (1: not known)
    capacity: float | None = None
    batch_fits: int | None = None
    micro_batch: float | None = None
    lower_bound: bool = False

    @property
    def temporaries(self) -> float:
        """The optimizer step's own bytes: what its peak holds beyond the persistent bytes and grads."""
        if self.at != "optimizer step":
            return 0.0
        return max(0.0, self.allocated - self.params - self.optimizer - self.buffers - self.data - self.grads)

    def parts(self) -> dict[str, float]:
        """The allocated peak's parts (:data:`PARTS`): the gradients at the optimizer step's peak, the
        activations at backward's; ``other`` what the columns leave (the optimizer's temporaries)."""
        step = self.at == "optimizer step"
        out = {"params": self.params, "optimizer": self.optimizer, "grads": self.grads if step else 0.0,
               "activations": 0.0 if step else (self.activations or 0.0), "buffers": self.buffers, "data": self.data}
        out["other"] = max(0.0, self.allocated - sum(out.values()))
        return out

    def peak(self, *, shard: float = 1.0, state: float = 1.0, acts: float = 1.0) -> float:
        """The allocated peak with parameters and gradients cut to ``shard`` of these, the optimizer
        state (and its temporaries) to ``shard * state``, and the activations scaled by ``acts``."""
        persistent = (self.params + self.optimizer * state) * shard + self.buffers + self.data
        backward = persistent + (self.activations or 0.0) * acts
        return max(backward, persistent + (self.grads + self.temporaries * state) * shard)

    def fits(self, peak: float) -> bool | None:
        """``peak`` (allocated), as reserved and grown by the model's margin, fits the capacity (None:
        not known: no capacity, or a lower bound that fits, which the activations may still exceed)."""
        if not self.capacity:
            return None
        ok = peak * self.reserved_ratio * (1 + MARGIN) <= self.capacity
        return None if ok and self.lower_bound else ok


def _col(r: pd.Series, name: str) -> float | None:
    return num(r.get(f"mem_pred_{name}_bytes"))


def footprint(r: pd.Series) -> Footprint | None:
    """The row's predicted footprint: its ``mem_pred_*`` columns, else the planner's skip reason
    (components under 0.05 GiB are not written there: read as 0); None when neither has one."""
    peak = num(r.get("mem_pred_bytes"))
    ws, gb = num(r.get("world_size")) or 1, num(r.get("global_batch"))
    micro = num(r.get("mem_pred_micro_batch")) or (gb / ws if gb and text(r.get("scaling")) != "weak" else gb)
    if peak is not None:
        reserved = num(r.get("mem_pred_reserved_bytes"))
        fits = num(r.get("mem_batch_fits"))
        return Footprint(params=_col(r, "params") or 0.0, grads=_col(r, "grads") or 0.0,
                         optimizer=_col(r, "optimizer") or 0.0, activations=_col(r, "activations"),
                         buffers=_col(r, "buffers") or 0.0, data=_col(r, "data") or 0.0, allocated=peak,
                         at=text(r.get("mem_pred_at")) or "backward",
                         reserved_ratio=reserved / peak if reserved and peak else 1.0,
                         capacity=num(r.get("mem_capacity_bytes")) or capacity_from(r.get("reason")),
                         batch_fits=None if fits is None else int(fits), micro_batch=micro,
                         lower_bound=text(r.get("mem_pred_how")).startswith("lower bound"))
    return _from_reason(text(r.get("reason")), micro)


def _from_reason(reason: str, micro: float | None) -> Footprint | None:
    """The footprint the planner wrote into a skip's reason (its peak is the process or reserved
    figure where it had one: read as allocated, the parts as written)."""
    m = _PEAK.search(reason)
    if not m:
        return None
    parts = {k: float(v) * GIB for k, v in (p.rsplit(" ", 1) for p in m[3].split(", ") if " " in p)}
    b = _BATCH.search(reason)
    fits = int(b[1]) if b else (0 if "not one sample per device fits" in reason else None)
    acts = parts.get("activations")
    return Footprint(params=parts.get("params", 0.0), grads=parts.get("grads", 0.0),
                     optimizer=parts.get("optimizer", 0.0), activations=None if m[2] else (acts or 0.0),
                     buffers=parts.get("buffers", 0.0), data=parts.get("data", 0.0), allocated=float(m[1]) * GIB,
                     at="optimizer step" if parts.get("grads") else "backward", capacity=float(m[4]) * GIB,
                     batch_fits=fits, micro_batch=float(b[2]) if b else micro, lower_bound=bool(m[2]))


def nearest(rows: pd.DataFrame) -> tuple[pd.Series, Footprint] | None:
    """Of ``rows`` (cells that ran out of memory), the one whose predicted peak is the smallest
    share of its capacity (the nearest to fitting), with its footprint; None when none has one."""
    found = [(r, fp) for _, r in rows.iterrows() if (fp := footprint(r)) is not None]
    if not found:
        return None
    return min(found, key=lambda x: x[1].allocated / (x[1].capacity or 1.0))


def whole(rows: pd.DataFrame) -> tuple[pd.Series, Footprint] | None:
    """Of ``rows``, the one that holds the most of the model on a device (the largest parameters:
    the reference, DDP), with its footprint: the base the changes cut."""
    found = [(r, fp) for _, r in rows.iterrows() if (fp := footprint(r)) is not None]
    if not found:
        return None
    return max(found, key=lambda x: (x[1].params, -(num(x[0].get("world_size")) or 1)))


def changes(cells: pd.DataFrame, r: pd.Series, fp: Footprint) -> tuple[Change, ...]:
    """What would make the cell ``r`` (footprint ``fp``, a whole copy of the model on each device)
    fit, each with its predicted allocated peak, cheapest first (:class:`ChangeKind`'s order)."""
    ws = int(num(r.get("world_size")) or 1)
    cpu = text(r.get("device")) == "cpu"
    same = cells[cells["workload"] == r.get("workload")] if "workload" in cells else cells.iloc[0:0]
    most = int(same["world_size"].max()) if len(same) and "world_size" in same else ws
    out: list[Change] = []
    n = ws if ws > 1 else max(most, 2)
    if fp.optimizer > 0 and text(r.get("strategy")) not in SHARDS_STATE:
        peak = fp.peak(state=1 / n)
        out.append(Change(kind=ChangeKind.SHARD_OPTIMIZER, strategy="ddp-zero1", world_size=n, peak_bytes=peak,
                          fits=fp.fits(peak), hosts=cpu and n > ws))
    out += _checkpoint(same, r, fp)
    if fp.batch_fits is not None and (fp.micro_batch is None or fp.batch_fits < fp.micro_batch):
        b = fp.batch_fits
        peak = fp.peak(acts=b / fp.micro_batch) if b and fp.micro_batch and fp.activations is not None else None
        out.append(Change(kind=ChangeKind.SMALLER_BATCH, batch=b, now=fp.micro_batch, peak_bytes=peak, fits=b > 0))
    out += _more_devices(r, fp, ws, cpu)
    return tuple(sorted(out, key=lambda c: c.fits is not True))  # stable: the cost order within each


def _checkpoint(same: pd.DataFrame, r: pd.Series, fp: Footprint) -> list[Change]:
    """Activation checkpointing: the run's prediction of the same cell at --ac full, else the share
    of the peak that is activations (no number: the probe at --ac full did not run)."""
    if text(r.get("ac")) == "full" or (fp.at != "backward" and not fp.activations):
        return []
    keys = [k for k in ("strategy", "world_size", "backend", "global_batch", "precision") if k in same and k in r]
    alike = same[same["ac"] == "full"] if "ac" in same else same.iloc[0:0]
    for k in keys:
        alike = alike[alike[k] == r[k]]
    for _, a in alike.iterrows():
        other = footprint(a)
        if other is not None and not other.lower_bound:
            cid = num(a.get("cell_id"))
            return [Change(kind=ChangeKind.CHECKPOINT, peak_bytes=other.allocated, fits=fp.fits(other.allocated),
                           cell=None if cid is None else int(cid))]
    if fp.activations is None or fp.at != "backward":
        return []
    return [Change(kind=ChangeKind.CHECKPOINT, activations=fp.activations / fp.allocated if fp.allocated else None)]


def _more_devices(r: pd.Series, fp: Footprint, ws: int, cpu: bool) -> list[Change]:
    """fsdp over the fewest devices, a power of two beyond ``ws``, whose predicted peak fits: the
    model and its state cut n ways, the activations at the n-th of the global batch (scaled with
    the micro-batch); the most devices a sample each when none does."""
    cut = ws if text(r.get("strategy")) == "fsdp" else 1  # the row's parameters are 1/cut of the model
    n, last = 2, None
    while n <= MOST_DEVICES and (fp.micro_batch is None or fp.micro_batch * ws / n >= 1):
        if n > ws or (n == ws and cut == 1):  # a whole copy on each device: fsdp over the same ones first
            peak = fp.peak(shard=cut / n, acts=ws / n)
            last = Change(kind=ChangeKind.MORE_DEVICES, strategy="fsdp", world_size=n, peak_bytes=peak,
                          fits=fp.fits(peak), hosts=cpu)
            if last.fits is not False:
                break
        n *= 2
    return [last] if last is not None else []


def used_fit(used: pd.Series, oom: pd.Series, gpu_mem: float | None) -> Fit:
    """The fit of a decision whose single-device reference ``oom`` ran out of memory: the peak of
    what it uses (``used``), measured where the device measures one, else its prediction, against
    the device (``gpu_mem``, else the capacity the row states)."""
    peak, predicted, device = num(used.get("peak_mem_bytes")), False, gpu_mem
    fp = footprint(used)
    if peak is None and fp is not None:
        peak, predicted = fp.allocated, True
    if not device and fp is not None:
        device = fp.capacity
    return Fit(fits_one_device=False, peak_bytes=peak, device_bytes=device or None,
               headroom=1 - peak / device if peak is not None and device else None,
               reference=text(oom.get("strategy")), parity_checked=pd.notna(used.get("parity_ok")),
               predicted=predicted, oom=oom_kind(oom.get("status"), oom.get("reason")),
               lower_bound=predicted and fp is not None and fp.lower_bound)


def nowhere(cells: pd.DataFrame) -> list[Decision]:
    """A decision for each workload that fits nowhere in the matrix: none of its training cells ran,
    and they ran out of memory (or were predicted to): the prediction of the cell nearest to fitting,
    and the changes that would make it fit, each with its predicted peak."""
    out = []
    for wl, rows in cells.groupby("workload", sort=True):
        gone = rows[ran_out(rows)]
        if (rows["status"] == "ok").any() or gone.empty:
            continue
        near = nearest(gone)
        r, fp = near if near is not None else (gone.sort_values("world_size").iloc[-1], None)
        refs = gone[is_reference(gone) & (gone["world_size"] == 1)]
        ref = refs.iloc[0] if len(refs) else r
        fit = Fit(fits_one_device=False if len(refs) else None, peak_bytes=fp.allocated if fp else None,
                  device_bytes=fp.capacity if fp else capacity_from(r.get("reason")), predicted=fp is not None,
                  reference=text(ref.get("strategy")) if len(refs) else "", parity_checked=False,
                  oom=oom_kind(ref.get("status"), ref.get("reason")), lower_bound=bool(fp and fp.lower_bound),
                  nearest=f"{text(r.get('strategy'))} x{int(num(r.get('world_size')) or 1)}",
                  missed=fp is not None and fp.fits(fp.allocated) is True
                  and oom_kind(r.get("status"), r.get("reason")) != OomKind.PLANNED,
                  changes=changes(cells, r, fp) if fp else ())
        out.append(Decision(
            workload=str(wl), backend=text(r.get("backend")), world_size=int(num(r.get("world_size")) or 1),
            knobs={k: str(r[k]) for k in knobs.NAMES if k in r and pd.notna(r[k])}, winner="", step_ms=0.0,
            kind=DecisionKind.UNDECIDED, ground=Ground.FITS_NOWHERE, resolved=True, fit=fit,
            excluded=tuple(Excluded(strategy=text(x.get("strategy")), kind=ExcludedKind.OUT_OF_MEMORY,
                                    detail=f"x{int(num(x.get('world_size')) or 1)}")
                           for _, x in gone.iterrows())))
    return out
