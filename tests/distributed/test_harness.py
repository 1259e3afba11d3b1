"""Real torchrun groups on gloo/CPU: DDP and the hand-written all-reduces match single device, and
the harness survives failing, hanging and wrong strategies."""

from __future__ import annotations

import pandas as pd
import pytest

from bench import launch
from bench.config import build_config
from bench.results import load_run

pytestmark = pytest.mark.distributed


def run(tmp_path, **flags) -> pd.DataFrame:
    flags.setdefault("device", "cpu")
    flags.setdefault("backends", "gloo")
    cfg = build_config(toml=None, flags={"out": str(tmp_path), **flags}, gpus=0)
    cells, _, _ = load_run(launch.run(cfg, 0, progress=False))
    return cells


def test_data_parallel_matches_single_device_at_2_and_4(tmp_path):
    cells = run(tmp_path, workloads="gpt-tiny,mlp", strategies="ddp,allreduce,allreduce-bucketed",
                world_sizes="2,4", steps=3, warmup=1)
    ok = cells[cells["status"] == "ok"]
    assert set(ok["world_size"]) == {1, 2, 4}
    assert len(ok) == 2 * (1 + 3 * 2), cells[["strategy", "world_size", "status", "reason"]]
    assert ok["parity_ok"].all(), ok[["workload", "strategy", "world_size", "parity_rel_err"]]
    assert (ok["parity_rel_err"] <= 1e-5).all()
    dp = ok[ok["strategy"] != "single"]
    assert (dp["parity_rel_err"] > 0).any() or (dp["world_size"] == 1).all()  # really compared
    assert ok["throughput_samples_s"].gt(0).all()
    assert ok["scaling_efficiency"].notna().all()


def test_wrong_failing_and_hanging_strategies_become_rows(tmp_path):
    cells = run(tmp_path, workloads="gpt-tiny",
                strategies="tests.helpers:NoAverage,tests.helpers:Raises,tests.helpers:Hangs,ddp",
                world_sizes="2", steps=3, warmup=1, cell_timeout_s=10)
    by = cells.set_index("strategy")
    assert by.loc["test-noaverage", "status"] == "ok"
    assert not by.loc["test-noaverage", "parity_ok"]  # trained a different model: parity shows it
    assert by.loc["test-raises", "status"] == "failed"
    assert "deliberate failure in prepare" in by.loc["test-raises", "reason"]
    assert by.loc["test-hangs", "status"] == "timeout"
    # the cell after the hang ran in a relaunched group
    assert by.loc["ddp", "status"] == "ok" and by.loc["ddp", "parity_ok"]
    assert by.loc["dataparallel", "status"] if "dataparallel" in by.index else True
