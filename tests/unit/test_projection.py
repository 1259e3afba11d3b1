"""Projection on a committed 4-GPU H100 run (tests/fixtures/runs) and on hand-built tables, with a
synthetic communication model: the fixed variant rule, the error against each repeat, and the
check tool (tools/projection_check.py) on a synthetic run folder."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from bench.comm.model import CommModel
from bench.comm.ops import busbw_factor
from bench.comm.projection import (
    Network,
    calls_per_step,
    check_table,
    check_with_repeats,
    error_spread,
    fastest_comm_per_step,
    fixed_variant,
    measured_comm_per_step,
    plot_projection,
    project,
    repeat_medians,
)

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
        assert g.loc[4, "err_fixed"] == pytest.approx(g.loc[4, "pred_step_fixed_s"] / c4["step_time_median_s"] - 1)
        assert g.loc[2, "pred_step_fixed_s"] == pytest.approx(c2["step_time_median_s"])
    ddp4 = p[(p["strategy"] == "ddp") & (p["world_size"] == 4)].iloc[0]
    grads = int(cells["params"].iloc[0]) * 4
    assert ddp4["comm_model_s"] == pytest.approx(26 * ALPHA[4] + grads * 1.5 / (BUSBW[4] * 1e9), rel=1e-6)
    t = check_table(p)
    assert len(t) == 3 and t["err_fixed_pct"].abs().lt(100).all()
    # one error is reported, the fixed variant's; the variants' predictions are marked unchecked
    assert [c for c in t.columns if "err" in c] == ["err_fixed_pct"]
    assert {"unchecked_pred_model_ms", "unchecked_pred_calibrated_ms"} <= set(t.columns)


def test_fixed_variant_on_the_committed_run_is_model(run4):
    """The committed run's 2-GPU calls: the fastest rank's copy of each call is near the model and
    the excess is waiting for a late peer, so the rule gives ``model`` to every family."""
    cells, comm = run4
    p = project(cells, comm, model(), worlds=(4,)).set_index("strategy")
    assert (p["variant_fixed"] == "model").all()
    assert (p["comm_recorded_2gpu_s"] > 5 * p["comm_fastest_2gpu_s"]).all()
    assert (p["pred_step_fixed_s"] == p["pred_step_s"]).all()


def test_projection_beyond_one_node_is_capped_by_the_network(run4):
    cells, comm = run4
    key = ["strategy", "world_size"]
    fast = project(cells, comm, model(), worlds=(8, 16), network=Network(inter_node_gbs=1000.0)).set_index(key)
    slow = project(cells, comm, model(), worlds=(8, 16), network=Network(inter_node_gbs=25.0)).set_index(key)
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


# Hand-built tables: one profiled step per cell, 2 ranks, one call of S bytes per rank and step.
S = 100 * 2**20


def _calls(cell: int, op: str, durations: dict[int, float]) -> list[dict]:
    recorded = S / 2 if op == "all_gather" else S  # all_gather records one rank's shard
    return [{"cell_id": cell, "rank": r, "backend": "nccl", "world_size": 2, "op": op, "group_size": 2.0,
             "bytes": recorded, "start_s": 10.0 + r * 1e-4, "duration_s": d} for r, d in durations.items()]


def hand_built() -> tuple[pd.DataFrame, pd.DataFrame, dict[str, float]]:
    """cells: single x1, ddp and fsdp at 2 and 4; comm: DDP's all_reduce runs at the model's time on
    the last rank to arrive while the other waits 10 ms (a wait), FSDP's all_gather runs 3 x the
    model's time on both ranks (a slow wire)."""
    m = {op: model().predict(op, "nccl", 2, S) for op in ("all_reduce", "all_gather")}
    cells = pd.DataFrame([
        {"cell_id": 0, "strategy": "single", "backend": "none", "world_size": 1, "step_time_median_s": 0.100,
         "compute_time_s": 0.090},
        {"cell_id": 1, "strategy": "ddp", "backend": "nccl", "world_size": 2, "step_time_median_s": 0.070,
         "compute_time_s": 0.050},
        {"cell_id": 2, "strategy": "ddp", "backend": "nccl", "world_size": 4, "step_time_median_s": 0.060,
         "compute_time_s": 0.030},
        {"cell_id": 3, "strategy": "fsdp", "backend": "nccl", "world_size": 2, "step_time_median_s": 0.080,
         "compute_time_s": 0.050},
        {"cell_id": 4, "strategy": "fsdp", "backend": "nccl", "world_size": 4, "step_time_median_s": 0.070,
         "compute_time_s": 0.030},
    ]).assign(status="ok", overlap_frac=0.0)
    comm = pd.DataFrame(_calls(1, "all_reduce", {0: m["all_reduce"] + 0.010, 1: m["all_reduce"]})
                        + _calls(3, "all_gather", {0: 3 * m["all_gather"], 1: 3 * m["all_gather"]}))
    return cells, comm, m


def test_fastest_rank_per_call_is_the_transfer_without_the_wait():
    comm = pd.DataFrame(
        [{"cell_id": 7, "rank": r, "op": "all_reduce", "bytes": 1e6, "start_s": t, "duration_s": d}
         for r, t, d in ((0, 1.0, 0.010), (0, 2.0, 0.002), (1, 1.0, 0.003), (1, 2.0, 0.009))]
        + [{"cell_id": 7, "rank": 0, "op": "SendRecv", "bytes": None, "start_s": 3.0, "duration_s": 5.0}])
    # call 1: rank 1 arrived last (3 ms), call 2: rank 0 (2 ms); two profiled steps
    assert fastest_comm_per_step(comm, 7, 2) == pytest.approx((0.003 + 0.002) / 2)
    assert measured_comm_per_step(comm, 7, 2) == pytest.approx((0.010 + 0.002 + 0.003 + 0.009) / 2 / 2)
    assert fastest_comm_per_step(comm, 8, 2) == 0.0


@pytest.mark.parametrize(("model_s", "fastest_s", "recorded_s", "variant"), [
    (1.0, 1.05, 10.0, "model"),        # the excess is waits for a late peer
    (1.0, 3.0, 3.2, "calibrated"),     # the excess is the transfer itself
    (1.0, 2.0, 3.0, "model"),          # as much wire as wait: the excess is held constant
    (1.0, 0.8, 0.9, "model"),          # faster than the curve
    (0.0, 0.0, 0.0, "model"),          # no recorded calls
    (math.nan, 1.0, 2.0, "model"),     # an op the sweep lacks
])
def test_fixed_variant_rule(model_s, fastest_s, recorded_s, variant):
    assert fixed_variant(model_s, fastest_s, recorded_s) == variant


def test_projection_uses_the_fixed_variant_per_family():
    cells, comm, m = hand_built()
    p = project(cells, comm, model(), worlds=(2, 4), steps=1).set_index(["strategy", "world_size"])
    assert p.loc[("ddp", 4), "variant_fixed"] == "model" and p.loc[("fsdp", 4), "variant_fixed"] == "calibrated"
    assert p.loc[("ddp", 4), "comm_fastest_2gpu_s"] == pytest.approx(m["all_reduce"])
    assert p.loc[("ddp", 4), "comm_recorded_2gpu_s"] == pytest.approx(m["all_reduce"] + 0.005)
    assert p.loc[("fsdp", 4), "comm_recorded_2gpu_s"] == pytest.approx(3 * m["all_gather"])
    for s, col in (("ddp", "pred_step_s"), ("fsdp", "pred_step_calibrated_s")):
        assert p.loc[(s, 4), "pred_step_fixed_s"] == p.loc[(s, 4), col]
        assert p.loc[(s, 2), "pred_step_fixed_s"] == pytest.approx(p.loc[(s, 2), "measured_step_s"])
        assert p.loc[(s, 4), "err_fixed"] == pytest.approx(p.loc[(s, 4), col] / p.loc[(s, 4), "measured_step_s"] - 1)
    assert p.loc[("fsdp", 4), "pred_step_calibrated_s"] != pytest.approx(p.loc[("fsdp", 4), "pred_step_s"])
    assert "err" not in p and "err_calibrated" not in p


def steps_table(medians: dict[int, list[float]], ranks: int = 2, n_steps: int = 3) -> pd.DataFrame:
    """Per cell, per repeat: timed steps whose slowest rank takes the given repeat median (rank r
    takes 1 ms less per rank below the last), after a warm-up step without a time."""
    rows = []
    for cid, per_rep in medians.items():
        for k, med in enumerate(per_rep):
            for r in range(ranks):
                rows.append({"cell_id": cid, "repeat": k, "rank": r, "step": 0, "phase": "warmup", "step_time_s": None})
                for i, dt in enumerate((-0.002, 0.0, 0.005)[:n_steps]):
                    rows.append({"cell_id": cid, "repeat": k, "rank": r, "step": i + 1, "phase": "timed",
                                 "step_time_s": med + dt - 0.001 * (ranks - 1 - r)})
    return pd.DataFrame(rows)


def test_repeat_medians_take_the_slowest_rank_and_timed_steps():
    st = steps_table({5: [0.100, 0.110, 0.090]})
    assert repeat_medians(st, 5).to_dict() == pytest.approx({0: 0.100, 1: 0.110, 2: 0.090})
    assert repeat_medians(st, 6).empty and repeat_medians(pd.DataFrame(), 5).empty
    one = st.drop(columns="repeat")[st["repeat"] == 0]  # a table without repeats is one repeat
    assert repeat_medians(one, 5).to_dict() == pytest.approx({0: 0.100})


def test_error_spread_over_repeats():
    e = error_spread(0.105, pd.Series([0.100, 0.110, 0.090, 0.105, 0.120]))
    assert e["repeats"] == 5
    assert e["err_median"] == pytest.approx(0.0)
    assert e["err_min"] == pytest.approx(0.105 / 0.120 - 1) and e["err_max"] == pytest.approx(0.105 / 0.090 - 1)
    none = error_spread(0.1, pd.Series(dtype=float))
    assert none["repeats"] == 0 and math.isnan(none["err_median"])


def test_check_with_repeats_reports_spread_and_input_intervals():
    cells, comm, _ = hand_built()
    reps = {0: [0.100, 0.101, 0.099], 1: [0.070, 0.068, 0.073], 2: [0.060, 0.062, 0.057, 0.061, 0.059],
            3: [0.080, 0.080, 0.080], 4: [0.070, 0.071, 0.069, 0.072, 0.068]}
    st = steps_table(reps)
    p = project(cells, comm, model(), worlds=(4, 8), steps=1)
    t = check_with_repeats(p, cells, st).set_index("strategy")
    assert list(t.index) == ["ddp", "fsdp"] and (t["world_size"] == 4).all()  # 8 GPUs: nothing measured
    d = t.loc["ddp"]
    assert d["repeats"] == 5 and d["x1_repeats"] == 3 and d["x2_repeats"] == 3
    errs = d["pred_fixed_s"] / np.array(reps[2]) - 1
    assert (d["err_median"], d["err_min"], d["err_max"]) == pytest.approx((np.median(errs), errs.min(), errs.max()))
    assert (d["measured_lo_s"], d["measured_hi_s"]) == pytest.approx((0.057, 0.062))
    assert (d["x2_lo_s"], d["x2_hi_s"]) == pytest.approx((0.068, 0.073))
    # the anchor moves the prediction one to one with the 2-GPU step
    assert d["pred_fixed_lo_s"] == pytest.approx(d["pred_fixed_s"] - 0.002)
    assert d["pred_fixed_hi_s"] == pytest.approx(d["pred_fixed_s"] + 0.003)
    assert t.loc["fsdp", "variant_fixed"] == "calibrated"
    assert t.loc["fsdp", "pred_fixed_lo_s"] == pytest.approx(t.loc["fsdp", "pred_fixed_s"])


def synthetic_sweep() -> pd.DataFrame:
    """A collective sweep at 2 GPUs whose times follow ``model()`` exactly."""
    m = model()
    rows = [{"backend": "nccl", "device": "cuda", "world_size": 2, "kind": "sweep", "status": "ok", "graph": False,
             "op": op, "dtype": "bf16", "bytes": float(2**k), "time_s": m.predict(op, "nccl", 2, 2**k),
             "busbw_gbs": 2**k * busbw_factor(op, 2) / m.predict(op, "nccl", 2, 2**k) / 1e9}
            for op in ("all_reduce", "all_gather", "reduce_scatter") for k in range(10, 31, 4)]
    return pd.DataFrame(rows)


@pytest.mark.tools
def test_projection_check_tool_on_a_synthetic_run_folder(tmp_path, capsys):
    """tools/projection_check.py on the committed run with its steps spread over 3 repeats and a
    synthetic sweep: the table, the CSV and the sidecar."""
    from tools import projection_check

    run = tmp_path / "run"
    shutil.copytree(RUN4, run)
    st = pd.read_parquet(RUN4 / "steps.parquet")
    reps = [st.assign(repeat=k, step_time_s=st["step_time_s"] * (1 + 0.01 * k)) for k in range(3)]
    pd.concat(reps, ignore_index=True).to_parquet(run / "steps.parquet", index=False)
    sweep = tmp_path / "sweep" / "collectives.parquet"
    sweep.parent.mkdir()
    synthetic_sweep().to_parquet(sweep, index=False)
    (sweep.parent / "meta.json").write_text(json.dumps({"run_id": "sweep-1", "command_line": ["parbench", "comm"]}))
    out = tmp_path / "out"
    assert projection_check.main([str(run), "--sweep", str(sweep), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "| ddp | 4 | model |" in printed and "(3)" in printed
    csv = pd.read_csv(out / "projection_check.csv")
    assert list(csv["strategy"]) == ["ddp", "fsdp", "tensor"] and (csv["repeats"] == 3).all()
    assert (csv["err_min_pct"] <= csv["err_median_pct"]).all() and (csv["err_median_pct"] <= csv["err_max_pct"]).all()
    side = json.loads((out / "projection_check.json").read_text())
    assert side["rule"]["variants"] == {"ddp": "model", "fsdp": "model", "tensor": "model"}
    assert side["sources"][0]["sweep"]["run_id"] == "sweep-1"
    run_meta = side["sources"][1]["cells_from"]
    assert run_meta["run_id"] == "20261126-054625-a107" and run_meta["gpus"] == "4x NVIDIA H100 80GB HBM3"
    assert run_meta["torch"] and run_meta["nccl"] and run_meta["command"].startswith("/work/main/bench/cli.py run")
    assert (out / "projection_check.md").read_text().startswith("Projection check")
    assert projection_check.main([str(tmp_path / "sweep"), "--sweep", str(sweep), "--out", str(out)]) == 2
