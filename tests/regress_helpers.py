"""Strategies with a known, injected slowdown, for calibrating the regression gate.

``--strategies tests.regress_helpers:Slow5`` runs :class:`strategies.single.Single` with every step
made 5% longer than it measured; ``Slow5DDP`` does the same to DDP. ``DDPSlowed`` is ``Slow5DDP``
under DDP's own name (``ddp``), so ``parbench compare`` pairs it with the ``ddp`` cell of a baseline
run, as a real regression in the strategy would be paired (an A/B of two runs). The delay is calibrated per
step (5% of that step's own time), so it holds on any machine and workload, and it is spun rather
than slept: a sleep wakes late by scheduler-sized amounts on a busy machine.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.results.store import CELL_COLUMNS, STEP_COLUMNS, frame

SLOWDOWN = 0.05


def slowed(step: Any, device: Any, factor: float = SLOWDOWN) -> Any:
    """The same step, each call held until (1 + factor) times its own duration has passed."""
    import torch

    inner = step.run

    def run(batch):
        t0 = time.perf_counter()
        out = inner(batch)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        until = t0 + (time.perf_counter() - t0) * (1 + factor)
        while time.perf_counter() < until:
            pass
        return out

    step.run = run
    return step


def _slow_classes() -> dict[str, type]:
    """Built on first use, so the unit tests that only need :func:`make_run` import no torch."""
    from strategies.ddp import DDPStrategy
    from strategies.single import Single

    class Slow5(Single):
        name = "slow5"
        summary = "single, every step 5% slower (regression-gate calibration)"

        def prepare(self, wl, ctx):
            return slowed(super().prepare(wl, ctx), ctx.device)

    class Slow5DDP(DDPStrategy):
        name = "slow5-ddp"
        summary = "ddp, every step 5% slower on every rank (regression-gate calibration)"

        def prepare(self, wl, ctx):
            return slowed(super().prepare(wl, ctx), ctx.device)

    class DDPSlowed(Slow5DDP):
        name = "ddp"
        summary = "ddp with every step 5% slower, under ddp's name (regression-gate A/B)"

    return {"Slow5": Slow5, "Slow5DDP": Slow5DDP, "DDPSlowed": DDPSlowed}


_CLASSES: dict[str, type] = {}


def __getattr__(name: str) -> type:
    """``tests.regress_helpers:Slow5``, ``:Slow5DDP`` and ``:DDPSlowed`` for ``--strategies``."""
    if name in ("Slow5", "Slow5DDP", "DDPSlowed"):
        if not _CLASSES:
            _CLASSES.update(_slow_classes())
        return _CLASSES[name]
    raise AttributeError(name)


# --- synthetic runs for the unit tests and microbenchmarks --------------------------------------

def make_run(times: dict[str, float], statuses=None, n=30, noise=0.01, seed=0, repeats=0, **cols):
    """(cells, steps): one cell per strategy; per-step times lognormal around ``times[strategy]``."""
    rng = np.random.default_rng(seed)
    rows, steps = [], []
    for i, (strategy, t) in enumerate(times.items()):
        rows.append(dict(cell_id=i, workload="w", strategy=strategy, backend="gloo", device="cpu", world_size=2,
                         status=(statuses or {}).get(strategy, "ok"), throughput_samples_s=8 / t, global_batch=8,
                         precision="fp32", step_time_ci_low_s=t * 0.99, step_time_ci_high_s=t * 1.01, **cols))
        for r in range(max(repeats, 1)):
            for s in range(n):
                for rank in (0, 1):
                    steps.append(dict(cell_id=i, rank=rank, step=s, phase="timed", repeat=r,
                                      step_time_s=t * float(np.exp(rng.normal(0, noise))) * (1 - 0.01 * rank)))
    st = frame(steps, STEP_COLUMNS)
    if not repeats:
        st = st.drop(columns="repeat")
    return frame(rows, CELL_COLUMNS), st


def write_run(path: Path, times: dict[str, float], commit: str | None = "c0", meta: dict | None = None,
              **kw) -> Path:
    """A run folder (cells.parquet, steps.parquet, meta.json) made by :func:`make_run`."""
    cells, steps = make_run(times, **kw)
    path.mkdir(parents=True)
    cells.to_parquet(path / "cells.parquet", index=False)
    steps.to_parquet(path / "steps.parquet", index=False)
    m = {"run_id": path.name, "git_commit": commit, "host": "h", "gpus": [], "torch": "2.13.0", "nccl": None,
         "platform": "Linux", "created_utc": "2026-11-26T00:00:00+00:00", **(meta or {})}
    (path / "meta.json").write_text(json.dumps(m))
    return path


def frames_compare(base, cur, threshold=0.05, *, base_steps=None, cur_steps=None, base_meta=None, cur_meta=None,
                   base_samples=None, **gate):
    """``compare`` of two sides given as frames (a history's samples for BASE's steps), under a gate of
    ``threshold`` that, unless told, judges one run's steps a side (``require_repeats`` off)."""
    from bench.gate.compare import Gate, Side, compare

    gate.setdefault("require_repeats", False)
    return compare(Side(base, base_steps, base_meta, base_samples), Side(cur, cur_steps, cur_meta),
                   Gate(threshold=threshold, **gate))
