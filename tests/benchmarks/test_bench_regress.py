"""Microbenchmarks of compare and history on 1,000 cells. Under the default ``--benchmark-disable``
each runs once, as a test; ``pytest tests/benchmarks --benchmark-enable`` times them."""

import numpy as np
import pandas as pd
import pytest

from bench.gate.history import add, baseline, show
from bench.results.store import CELL_COLUMNS, STEP_COLUMNS, frame
from tests.regress_helpers import frames_compare

CELLS, STEPS = 1000, 20


def big_run(seed: int, slow: float = 0.0) -> tuple[pd.DataFrame, pd.DataFrame]:
    """1,000 ok cells (one workload per cell), 20 timed steps on 2 ranks each, built vectorised."""
    base_t = np.exp(np.random.default_rng(42).uniform(-5, 0, CELLS))  # the same cells in every run
    rng = np.random.default_rng(seed)
    cells = frame([dict(cell_id=i, workload=f"w{i}", strategy="ddp", backend="gloo", device="cpu", world_size=2,
                        status="ok", precision="fp32", global_batch=8, throughput_samples_s=8 / base_t[i],
                        step_time_median_s=base_t[i]) for i in range(CELLS)], CELL_COLUMNS)
    n = CELLS * STEPS * 2
    cid = np.repeat(np.arange(CELLS), STEPS * 2)
    steps = pd.DataFrame(dict(cell_id=cid, rank=np.tile([0, 1], CELLS * STEPS),
                              step=np.tile(np.repeat(np.arange(STEPS), 2), CELLS), phase="timed",
                              step_time_s=base_t[cid] * (1 + slow) * np.exp(rng.normal(0, 0.01, n))))
    return cells, frame(steps.to_dict("records"), STEP_COLUMNS)


@pytest.fixture(scope="module")
def runs():
    return big_run(0), big_run(1, slow=0.1)


def test_compare_1000_cells(benchmark, runs):
    (bc, bs), (cc, cs) = runs
    t = benchmark(frames_compare, bc, cc, 0.05, base_steps=bs, cur_steps=cs)
    assert len(t) == CELLS and (t["verdict"] == "regression").mean() > 0.95


@pytest.fixture(scope="module")
def run_dir(runs, tmp_path_factory):
    """The first big run as a run folder, its meta.json rewritten per add (run id, commit)."""
    (bc, bs), _ = runs
    src = tmp_path_factory.mktemp("run")
    bc.to_parquet(src / "cells.parquet", index=False)
    bs.to_parquet(src / "steps.parquet", index=False)
    return src


def _add(src, store, run_id: str, commit: str) -> dict:
    (src / "meta.json").write_text(f'{{"run_id": "{run_id}", "git_commit": "{commit}", "host": "h"}}')
    return add(src, store)


def test_history_append_1000_cells(benchmark, run_dir, tmp_path_factory):
    store = tmp_path_factory.mktemp("store")
    ids = iter(range(10**6))
    e = benchmark.pedantic(lambda: _add(run_dir, store, f"r{next(ids)}", "c0"), rounds=3, iterations=1)
    assert e["machine"] and (store / e["file"]).is_file()


def test_history_show_and_baseline_1000_cells(benchmark, run_dir, tmp_path_factory):
    store = tmp_path_factory.mktemp("store")
    for k in range(3):
        _add(run_dir, store, f"r{k}", f"c{k}")
    table, (base, samples, _) = benchmark.pedantic(lambda: (show(store), baseline(store)), rounds=3, iterations=1)
    assert len(table) == CELLS and len(base) == CELLS and len(samples[0].values) == 3 * STEPS
