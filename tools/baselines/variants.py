"""Harness strategies under another default, for running two settings of one strategy side by side.

``--option`` applies to every cell of a run, so one run cannot hold ``tensor`` with the Megatron
plan and ``tensor`` with sequence parallel. These subclasses change a default and the name, nothing
else, so both settings can share one ``parbench run`` (and its process groups' start-up)::

    parbench run --strategies tensor,tools.baselines.variants:TensorSP --world-sizes 2,4

``interleave.py`` uses them to measure the ``tensor`` and ``tensor-sp`` families in one harness call.
"""

from __future__ import annotations

import dataclasses

from strategies.tensor import TP_PLAN, TensorParallel


class TensorSP(TensorParallel):
    name = "tensor-sp"
    summary = "tensor parallel, torchtitan's plan by default (sequence parallel norms, loss parallel)"
    options = (dataclasses.replace(TP_PLAN, default="sp"),)
