"""Projection on a committed 4-GPU H100 run (tests/fixtures/runs), with a synthetic communication model."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest

from bench.comm.model import CommModel
from bench.comm.projection import calls_per_step, check_table, plot_projection, project
from bench.comm.worker import busbw_factor

RUN4 = Path(__file__).resolve().parents[1] / "fixtures" / "runs" / "four-gpus-h100"
ALPHA, BUSBW = {2: 20e-6, 4: 25e-6}, {2: 300.0, 4: 330.0}


def model() -> CommModel:
    rows = [{"op": op, "backend": "nccl", "device": "cuda", "world_size": w, "lo": 0.0, "hi": math.inf,
             "alpha_s": ALPHA[w], "beta_bps": BUSBW[w] * 1e9 / busbw_factor(op, w), "busbw_gbs": BUSBW[w],
             "rel_rms": 0.0, "rel_max": 0.0, "points": 4}
            for op in ("all_reduce", "all_gather", "reduce_scatter") for w in (2, 4)]
    return CommModel(pd.DataFrame(rows))


@pytest.fixture(scope="module")
def run4() -> tuple[pd.DataFrame, pd.DataFrame]:
    return pd.read_parquet(RUN4 / "cells.parquet"), pd.read_parquet(RUN4 / "comm.parquet")


def cell_id(cells: pd.DataFrame, strategy: str, world: int) -> int:
    return int(cells[(cells["strategy"] == strategy) & (cells["world_size"] == world)]["cell_id"].iloc[0])


@pytest.mark.parametrize("world", [2, 4])
def test_volumes_per_step_match_the_model_size(run4, world):
    """From recorded calls: DDP reduces every fp32 gradient once; FSDP gathers the parameters twice
    (forward and backward) and reduce-scatters the gradients once; the same S at 2 and 4 GPUs."""
    cells, comm = run4
    grads = int(cells["params"].iloc[0]) * 4
    vol = lambda s: calls_per_step(comm, cell_id(cells, s, world), 2).assign(
        v=lambda d: d["size_bytes"] * d["per_step"]).groupby("op")["v"].sum()
    assert vol("ddp").to_dict() == {"all_reduce": pytest.approx(grads)}
    f = vol("fsdp")
    assert f["all_gather"] == pytest.approx(2 * grads) and f["reduce_scatter"] == pytest.approx(grads)
    assert set(vol("tensor").index) == {"all_reduce"}


def test_projection_reproduces_the_2gpu_step_and_checks_4(run4):
    cells, comm = run4
    p = project(cells, comm, model(), worlds=(1, 2, 4))
    assert set(p["strategy"]) == {"ddp", "fsdp", "tensor"} and (p["kind"] == "projected").all()
    single = cells[cells["strategy"] == "single"].iloc[0]
    for s, g in p.groupby("strategy"):
        g = g.set_index("world_size")
        c2 = cells[(cells["strategy"] == s) & (cells["world_size"] == 2)].iloc[0]
        assert g.loc[2, "pred_step_s"] == pytest.approx(c2["step_time_median_s"])  # the anchor
        assert g.loc[2, "pred_step_calibrated_s"] == pytest.approx(c2["step_time_median_s"])
        assert g.loc[1, "compute_s"] == pytest.approx(single["compute_time_s"])
        assert g.loc[2, "compute_s"] == pytest.approx(c2["compute_time_s"])
        c4 = cells[(cells["strategy"] == s) & (cells["world_size"] == 4)].iloc[0]
        assert g.loc[4, "measured_step_s"] == c4["step_time_median_s"]
        assert g.loc[4, "err"] == pytest.approx(g.loc[4, "pred_step_s"] / c4["step_time_median_s"] - 1)
    ddp4 = p[(p["strategy"] == "ddp") & (p["world_size"] == 4)].iloc[0]
    grads = int(cells["params"].iloc[0]) * 4
    assert ddp4["comm_model_s"] == pytest.approx(26 * ALPHA[4] + grads * 1.5 / (BUSBW[4] * 1e9), rel=1e-6)
    t = check_table(p)
    assert len(t) == 3 and t["err_pct"].abs().lt(100).all()


def test_projection_beyond_one_node_is_capped_by_the_network(run4):
    cells, comm = run4
    fast = project(cells, comm, model(), worlds=(8, 16), inter_node_gbs=1000.0).set_index(["strategy", "world_size"])
    slow = project(cells, comm, model(), worlds=(8, 16), inter_node_gbs=25.0).set_index(["strategy", "world_size"])
    assert slow.loc[("ddp", 8), "comm_model_s"] == pytest.approx(fast.loc[("ddp", 8), "comm_model_s"])
    assert slow.loc[("ddp", 16), "comm_model_s"] > 5 * fast.loc[("ddp", 16), "comm_model_s"]
    assert slow.loc[("ddp", 16), "nodes"] == 2 and slow["measured_step_s"].isna().all()


def test_projection_needs_the_single_device_cell(run4):
    cells, comm = run4
    with pytest.raises(ValueError, match="single"):
        project(cells[cells["strategy"] != "single"], comm, model())


def test_figure_is_written(run4, tmp_path):
    cells, comm = run4
    out = plot_projection(project(cells, comm, model()), tmp_path / "projection.png", title="test")
    assert out.stat().st_size > 10_000
