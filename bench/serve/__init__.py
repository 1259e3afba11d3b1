"""Serving benchmark: one model on every device, each fed different users' requests.

Modules: :mod:`loadgen` (seeded arrivals and sizes), :mod:`policies` (balancing, plus a discrete
event simulation of them), :mod:`models` (inference: GPT scoring, KV-cache generation, convnet,
user workloads), :mod:`worker` (a serving process), :mod:`launcher` (placements, dispatch, one
cell), :mod:`steady` (steady-state, kept-up and latency-target verdicts), :mod:`schema` (columns
and rows), :mod:`config`, :mod:`sweep` (MLPerf Server rate search) and :mod:`run` (a whole
``parbench serve`` run). The serving estimators (percentiles with LoadGen's early-stopping rule,
Little's law, imbalance) are in :mod:`bench.stats.serving`. See docs/guides/serving.md.
"""
