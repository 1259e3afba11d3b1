"""The parity check's tolerances and its distance: how far a cell's losses may lie from one
device's, and how far they do. Numbers only (numpy, no pandas): the ranks import it for the
rounding check (:mod:`bench.train.rounding`), the results for the verdict (:mod:`bench.results.derived`).
"""

from __future__ import annotations

import numpy as np

#: relative tolerance of the parity check, by precision, over the first PARITY_STEPS steps: a
#: legitimate reordering of sums (micro-batches, buckets) differs by float rounding that training
#: then amplifies step after step, so the adaptive loops' longer runs are compared on a fixed horizon
PARITY_TOL = {"fp32": 1e-5, "bf16": 2e-2}
PARITY_STEPS = 25
#: the fp32 tolerance under Adam and AdamW: their update divides each gradient by the root of its
#: running square, so a rounding difference in a small gradient moves the update by far more than
#: under SGD. Measured on CPU (gloo, AdamW, world sizes 2 and 4, PARITY_STEPS steps), the largest
#: relative loss difference was 1.0e-4 for convnet (ddp, allreduce-bucketed, pipeline-1f1b),
#: 2.1e-6 for mlp and 2.6e-7 for gpt-tiny, where the same cells under SGD stay below 1e-5
ADAM_FP32_TOL = 1e-3


def relative_difference(losses, reference) -> np.ndarray:
    """Step by step, how far ``losses`` lie from ``reference``'s, relative to the reference's."""
    a, b = np.asarray(losses, dtype=float), np.asarray(reference, dtype=float)
    return np.abs(a - b) / np.maximum(np.abs(b), 1e-12)


def parity_tol(precision: str, optimizer: str) -> float:
    """The parity tolerance of a cell trained in ``precision`` with ``optimizer``."""
    tol = PARITY_TOL.get(precision, 1e-5)
    return max(tol, ADAM_FP32_TOL) if optimizer in ("adam", "adamw") else tol
