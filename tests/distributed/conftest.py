"""Real runs that more than one test module of this folder checks: each runs once per session, on
first use (a torchrun start-up costs seconds on an idle 2-core machine, many more on a loaded one).

* ``zoo``: every strategy at world sizes 2 and 4, profiled inline (test_harness: each strategy
  matches one device; test_profile_pass: the inline profile, against a pass at the end);
* ``faults``: every in-rank fault, the misbehaving strategies, a broken user workload and healthy
  strategies after them (test_faults: each fault is a row; test_harness: wrong, failing and hanging
  strategies are rows);
* ``one_rank_rounds``: three cells at world size 1 in balanced rounds, sampled (test_noise: the
  rounds; test_telemetry: the samples).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from bench.results.run import load_run
from tests.distributed.runs import FAULTS, QUICK, ZOO_WORKLOAD, run


@pytest.fixture(scope="session")
def zoo(tmp_path_factory) -> pd.DataFrame:
    """One run of every registered strategy at world sizes 2 and 4 (3 steps after 1 warm-up), each
    cell profiled for one step inline (the CPU default): the checks read the communication per
    profiled step, the breakdown's presence and the parameters a rank holds, which a second
    profiled step does not change. SGD: its parity at 1e-5 sees a gradient's scale, which Adam's
    update divides out (docs/guides/training-knobs.md)."""
    return load_run(run(tmp_path_factory.mktemp("zoo"), workloads=ZOO_WORKLOAD, strategies="all",
                        world_sizes="2,4", steps=3, warmup=1, profile_steps=1, training={"optimizer": "sgd"},
                        **QUICK))[0]


@pytest.fixture(scope="session")
def faults(tmp_path_factory) -> tuple[pd.DataFrame, dict, Path]:
    """One run at world size 2 over every in-rank fault, strategies that train the wrong model or
    distribute nothing, a hang in prepare, two healthy data-parallel strategies after the faults,
    and a broken user workload (its cells first: each fails at its first batch)."""
    d = run(tmp_path_factory.mktemp("faults"), world_sizes="2", workloads="tests.helpers:broken_batches,mlp",
            strategies=FAULTS, cell_timeout_s=8, steps=12, warmup=1, profile_steps=0, **QUICK,
            # SGD: Adam's update divides out a gradient's scale, so NoAverage's missing 1/W would train
            # (nearly) the same model under it, and parity could not tell. 12 steps: a doubled
            # gradient moves mlp's loss slowly, by about 130x its rounding after 2 steps (inside the
            # tolerance the rounding rule gives) and about 860x after 12 (well outside it)
            training={"optimizer": "sgd"})
    cells, _, meta = load_run(d)
    return cells, meta, d


@pytest.fixture(scope="session")
def one_rank_rounds(tmp_path_factory) -> Path:
    """single, ddp and allreduce on mlp at world size 1 (one process group), 3 repeats in balanced
    rounds of 3 steps, with the host sampler on at 50 Hz; the run folder."""
    return run(tmp_path_factory.mktemp("rounds"), workloads="mlp", strategies="single,ddp,allreduce",
               world_sizes="1", steps=3, warmup=1, repeats=3, target_ci=0, settle=0, profile_steps=0, sample_hz=50)
