"""Serving benchmark (issue 15): one model on every device, each fed different users' requests.

Modules: :mod:`loadgen` (seeded arrivals and sizes), :mod:`policies` (balancing, plus a discrete
event simulation of them), :mod:`models` (inference: GPT scoring, KV-cache generation, convnet,
user workloads), :mod:`worker` (a serving process), :mod:`launcher` (placements, dispatch, one
cell), :mod:`stats` (percentiles with LoadGen's early-stopping rule, Little's law), :mod:`schema`
(columns and rows), :mod:`config`, :mod:`sweep` (MLPerf Server rate search) and :mod:`run` (a
whole ``parbench serve`` run). See docs/SERVING.md.
"""
