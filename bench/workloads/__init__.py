"""Workloads: a model, its data and its loss, with nothing about parallelism.

Every strategy runs the same workload: the same model (built from the seed), the same global batch
at every step (derived from the seed and the step number) and the same loss. A user's own workload
enters as ``package.module:factory``; the factory returns a :class:`Workload`.
"""

from bench.workloads.base import Batch, Workload, build_on, display_name, seeded, shard
from bench.workloads.registry import names, planned, resolve

__all__ = ["Batch", "Workload", "build_on", "display_name", "names", "planned", "resolve", "seeded", "shard"]
