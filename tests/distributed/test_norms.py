"""Parity on a user's CNN (gloo, CPU, world size 2): GroupNorm passes; BatchNorm fails with a
reason that names BatchNorm as a difference in semantics, not rounding."""

from __future__ import annotations

import pytest

from bench.cli.summary import needs_a_look
from bench.core.config import build_config
from bench.decide.recommend import candidates
from bench.results.run import load_run
from bench.train import launcher as launch

pytestmark = [pytest.mark.distributed, pytest.mark.long]  # a run of its own: two models x two strategies


def test_groupnorm_passes_and_batchnorm_is_named(tmp_path):
    flags = {"device": "cpu", "backends": "gloo", "world_sizes": "2", "strategies": "single,ddp", "steps": 4,
             "warmup": 2, "profile_steps": 0, "sample_hz": 0, "out": str(tmp_path),
             "workloads": "tests.foreign_models:batchnorm_cnn,tests.foreign_models:groupnorm_cnn"}
    cells, _, _ = load_run(launch.run(build_config(toml=None, flags=flags, gpus=0), 0))
    ddp = cells[cells["strategy"] == "ddp"].set_index("workload")
    assert (cells["status"] == "ok").all(), cells[["workload", "strategy", "status", "reason"]]
    assert ddp.loc["groupnorm-cnn", "parity_ok"], ddp["parity_rel_err"]
    assert not ddp.loc["batchnorm-cnn", "parity_ok"] and ddp.loc["batchnorm-cnn", "batch_norm"] == "BatchNorm2d"
    lines = [x for x in needs_a_look(cells) if "batchnorm-cnn" in x and "parity" in x]
    assert lines and "the model has BatchNorm2d: each rank normalises over its share of the batch" in lines[0]
    # the tolerance follows the reference's own rounding (bench.train.rounding): far below BatchNorm's difference
    tol = ddp.loc["batchnorm-cnn", "parity_tol"]
    assert "at step" in lines[0] and f"> tolerance {tol:.2g}" in lines[0] and tol < 1e-4, (lines, tol)
    assert cells.set_index(["workload", "strategy"]).loc[("groupnorm-cnn", "single"), "parity_rounding"] > 0
    _, why = candidates(cells)
    assert any("BatchNorm2d" in w.detail for w in why), why
