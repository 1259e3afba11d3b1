"""Real torchrun groups on gloo/CPU: every strategy matches single device at world sizes 2 and 4,
and the harness survives failing, hanging and wrong strategies. Both runs are fixtures of
tests/distributed/conftest.py: ``zoo`` (test_profile_pass reads its inline profiles) and
``faults`` (test_faults checks its in-rank faults)."""

from __future__ import annotations

import pandas as pd
import pytest

import strategies
from bench.results.run import load_run
from tests.distributed.runs import run as run_folder

pytestmark = pytest.mark.distributed

GPU_ONLY = {"dataparallel", "layersplit"}
HYBRIDS = {"dp-pp", "fsdp-tp"}


def run(tmp_path, **flags) -> pd.DataFrame:
    return load_run(run_folder(tmp_path, **flags))[0]


@pytest.mark.parametrize("name", [n for n in strategies.names() if n not in GPU_ONLY | {"single"}])
def test_strategy_matches_single_device_on_gloo(zoo, name):
    rows = zoo[zoo["strategy"] == name]
    ok = rows[rows["status"] == "ok"]
    sizes = {4} if name in HYBRIDS else ({2} if name == "encoder-head" else {2, 4})
    assert set(ok["world_size"]) == sizes, rows[["world_size", "status", "reason"]].to_string()
    assert ok["parity_ok"].all() and (ok["parity_rel_err"] <= 1e-5).all(), ok[["world_size", "parity_rel_err"]]
    assert ok["throughput_samples_s"].gt(0).all()
    # the distribution check passed: communication every step, and the model split where it should be
    if "comm" in strategies.REGISTRY[name].distributes:  # an ensemble exchanges nothing while training
        assert ok["comm_calls_per_step"].gt(0).all(), ok[["world_size", "comm_calls_per_step"]]
    if name in ("fsdp", "fsdp-noreshard"):
        assert (ok["param_share"] <= 1.25 / ok["world_size"]).all(), ok[["world_size", "param_share"]]
    if name.startswith("pipeline") or name in ("chain", "tensor", "dp-pp", "fsdp-tp"):
        assert ok["param_share"].lt(0.95).all(), ok[["world_size", "param_share"]]


@pytest.mark.parametrize("name", sorted(GPU_ONLY))
def test_gpu_only_strategies_are_skipped_with_a_reason(zoo, name):
    rows = zoo[zoo["strategy"] == name]
    assert (rows["status"] == "skipped").all() and rows["reason"].str.len().gt(10).all()


def test_pipeline_rows_carry_schedule_and_bubble(zoo):
    p = zoo[zoo["strategy"].str.startswith("pipeline") & (zoo["status"] == "ok")]
    assert set(p["schedule"]) == {"gpipe", "1f1b", "interleaved-1f1b"}
    gpipe4 = p[(p["schedule"] == "gpipe") & (p["world_size"] == 4)].iloc[0]
    m = gpipe4["micro_batches"]
    assert gpipe4["bubble_theory"] == pytest.approx(3 / (m + 3))
    assert p["bubble_measured"].between(0, 1).all()
    one_loop = p[p["schedule"] != "interleaved-1f1b"]
    assert one_loop["bubble_stages"].between(0, 1).all()
    assert one_loop["stage_model_step_s"].gt(0).all() and one_loop["pipeline_gap"].notna().all()
    # The model's step is at least the busiest rank's busy time: it adds the others' first pass.
    assert (one_loop["stage_model_step_s"] >= one_loop["stage_busy_s"]).all()


def test_hybrids_report_their_mesh_and_ensemble_its_aggregation(zoo):
    ok = zoo[zoo["status"] == "ok"].set_index(["strategy", "world_size"])
    assert ok.loc[("fsdp-tp", 4), "mesh"] == "dp2xtp2" and ok.loc[("dp-pp", 4), "mesh"] == "dp2xpp2"
    ens = ok.loc[("ensemble", 4)]
    assert ens["role"] == "independent" and ens["aggregate_s"] > 0 and ens["aggregate_bytes"] > 0


@pytest.fixture(scope="module")
def misbehaving(faults) -> pd.DataFrame:
    """The mlp cells of the ``faults`` run (world size 2; a second workload beside the zoo's gpt-tiny):
    strategies that train the wrong model, distribute nothing, raise or hang, and two healthy
    data-parallel strategies that run after faults stopped their group."""
    cells = faults[0]
    return cells[cells["workload"] == "mlp"]


@pytest.mark.long  # the faults run: ~75 s of cell timeouts on 2 cores
def test_data_parallel_on_a_second_workload(misbehaving):
    ok = misbehaving[misbehaving["strategy"].isin(["ddp", "allreduce-bucketed"]) & (misbehaving["status"] == "ok")]
    assert set(ok["strategy"]) == {"ddp", "allreduce-bucketed"}, misbehaving[["strategy", "status", "reason"]]
    assert ok["parity_ok"].all() and (ok["parity_rel_err"] <= 1e-5).all()
    assert (ok["parity_rel_err"] > 0).all()  # really compared, not copied


@pytest.mark.slow  # the same strategies at 2 and 4 on mlp; the fast suite has them at 2 on mlp, 2 and 4 on gpt-tiny
def test_data_parallel_on_a_second_workload_at_2_and_4(tmp_path):
    cells = run(tmp_path, workloads="mlp", strategies="ddp,allreduce-bucketed", world_sizes="2,4", steps=3,
                warmup=1)
    ok = cells[cells["status"] == "ok"]
    assert len(ok) == 5 and ok["parity_ok"].all()
    assert (ok.loc[ok["world_size"] > 1, "parity_rel_err"] > 0).all()  # really compared, not copied


@pytest.mark.long  # the faults run: ~75 s of cell timeouts on 2 cores
def test_wrong_failing_and_hanging_strategies_become_rows(misbehaving):
    by = misbehaving.set_index("strategy")
    assert by.loc["test-noaverage", "status"] == "ok"
    assert not by.loc["test-noaverage", "parity_ok"]  # trained a different model: parity shows it
    # Same losses as one device, but nothing was distributed: a failure, never a clean row.
    inert = by.loc["test-inert"]
    assert inert["status"] == "failed" and inert["reason"].startswith("did not distribute: no communication")
    assert inert["parity_ok"] is pd.NA or pd.isna(inert["parity_ok"])  # parity is only judged for ok cells
    assert inert["comm_calls_per_step"] == 0 and inert["param_share"] == 1.0
    assert by.loc["test-raises", "status"] == "failed"
    assert "deliberate failure in prepare" in by.loc["test-raises", "reason"]
    assert by.loc["test-hangs", "status"] == "timeout"
    # the cells after a hang (test-hangs-collective's, before them) ran in a relaunched group
    assert by.loc["ddp", "status"] == "ok" and by.loc["ddp", "parity_ok"]
