"""How far a workload's own float rounding moves its losses: the one-device reference trains its
first steps again from the same seed on the same batches with the samples of each batch in reverse
order. The two runs compute the same sums in another order (a batch's mean loss, its weight
gradients, normalisation statistics over the batch), so they differ by rounding alone, amplified
step after step as training amplifies it; the largest relative loss difference is the reference's
``parity_rounding``, from which the parity tolerance of the cells compared with it is derived
(:func:`bench.results.derived.cell_tol`).

Reversing keeps what data parallelism keeps (every sample, every batch statistic of the whole batch)
and changes what it changes (the order of the sums), so a model whose distributed losses differ
from one device's by far more than this amount (ROUNDING_FACTOR times: a max-pool or a ReLU turns
a rounding difference into another choice, which one reordering need not hit) differs by more than
rounding."""

from __future__ import annotations

import math
from typing import Any

import torch

from bench.core.spec import CellSpec, RankMeasurement
from bench.stats.parity import PARITY_STEPS, relative_difference
from bench.train.cell import PLACE, build, release


def reversed_batch(batch: Any) -> Any:
    """``batch`` with its samples in reverse order along the first dimension (tensors, and tuples,
    lists and dicts of them sharing that dimension); None where it has no such dimension."""
    sizes: set[int] = set()

    def flip(x):
        if isinstance(x, torch.Tensor):
            if x.dim() == 0:
                return x
            sizes.add(x.shape[0])
            return x.flip(0)
        if isinstance(x, (tuple, list)):
            return type(x)(flip(v) for v in x)
        if isinstance(x, dict):
            return {k: flip(v) for k, v in x.items()}
        return x

    out = flip(batch)
    return out if len(sizes) == 1 and next(iter(sizes)) > 1 else None


def probes(cell: CellSpec) -> bool:
    """Whether ``cell`` measures its rounding: a one-device reference that a multi-device cell is
    compared with (``CellSpec.compared``) and that trains in eager mode (a compiled twin would
    compile its graphs a second time for it)."""
    return (cell.role == "reference" and cell.n_procs == 1 and cell.mode == "train" and cell.compared
            and cell.training.compile != "on")


def rounding(cell: CellSpec, local_rank: int, losses: list[float]) -> float | None:
    """The largest relative difference between ``losses`` (the cell's own, from its first step) and
    those of the same steps trained again on reversed batches; None where the batches cannot be
    reversed or the losses are not finite."""
    n = min(PARITY_STEPS, len(losses))  # the parity check's horizon
    if n < 2 or not all(math.isfinite(x) for x in losses[:n]):
        return None
    step = batches = None
    try:
        _, _, batches, step, _ = build(cell, local_rank, RankMeasurement(rank=0, **PLACE))
        flipped = [reversed_batch(b) for b in batches]
        if any(b is None for b in flipped):
            return None
        batches = flipped
        again = [float(step.run(batches[s % len(batches)])) for s in range(n)]
    finally:
        step = batches = None
        release(cell)
    worst = float(relative_difference(again, losses[:n]).max())
    return worst if math.isfinite(worst) else None
