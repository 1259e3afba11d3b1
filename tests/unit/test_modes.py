"""Every mode plans typed, frozen cell specs, and every row starts from its spec through the one row
start (bench.results.identity.start_row): identity and outcome columns, an unknown status refused."""

import dataclasses
import subprocess
import sys

import pytest

from bench.core import spec as contract
from bench.core.spec import CollectiveGroupSpec, ContractError, ServeCellSpec
from bench.results.identity import start_row
from tests.unit.test_rows import spec as train_cell

CELL_IDENTITY = ["cell_id", "mode", "workload", "strategy", "backend", "device", "world_size"]


def serve_cell(**kw) -> ServeCellSpec:
    return ServeCellSpec(**{**dict(cell_id=3, workload="gpt-tiny", strategy="replicas", policy="jsq",
                                   load="poisson@20/s", scenario="levels", task="score", offered_rps=20.0,
                                   batch_max=1, batch_wait_s=0.0, slo_s=None, device="cpu", world_size=2,
                                   precision="fp32", params=1000), **kw})


def group(**kw) -> CollectiveGroupSpec:
    return CollectiveGroupSpec(**{**dict(backend="gloo", device="cpu", world_size=2, ops=("all_reduce",),
                                         dtypes=("fp32",), sizes=(1024, 2048), iters=3, warmup=1, budget_s=0.0,
                                         max_iters=10, graph_max_bytes=0, reference=True, pg_timeout_s=30.0,
                                         out="/tmp/rows.json"), **kw})


def test_a_training_cell_starts_its_row_from_its_spec():
    cell = train_cell(n=4)
    row = start_row(cell, status="failed", reason="boom", wall_s=1.5, nproc=4)
    assert list(row)[:7] == CELL_IDENTITY
    assert (row["mode"], row["workload"], row["strategy"], row["world_size"]) == ("train", cell.workload.name,
                                                                                  "ddp", 4)
    assert (row["status"], row["reason"], row["cell_wall_s"], row["nproc"]) == ("failed", "boom", 1.5, 4)


def test_a_serving_cell_starts_its_row_from_its_spec():
    row = start_row(serve_cell(), serve_policy="jsq")
    assert list(row)[:7] == CELL_IDENTITY
    assert [row[k] for k in CELL_IDENTITY] == [3, "serve", "gpt-tiny", "replicas", "mp-queue", "cpu", 2]
    assert (row["status"], row["reason"], row["serve_policy"]) == ("ok", None, "jsq")
    assert "cell_wall_s" not in row


def test_a_collective_point_and_group_start_their_rows_from_their_specs():
    g = group()
    point = start_row(g.point("sweep", "all_reduce", "fp32", 1024), status="skipped", reason="no p2p", count=256)
    assert point == {"backend": "gloo", "device": "cpu", "world_size": 2, "kind": "sweep", "op": "all_reduce",
                     "dtype": "fp32", "bytes": 1024, "count": 256, "status": "skipped", "reason": "no p2p"}
    failed = start_row(g, status="failed", reason="group exited 1: boom", kind="sweep")
    assert failed == {"backend": "gloo", "device": "cpu", "world_size": 2, "kind": "sweep", "status": "failed",
                      "reason": "group exited 1: boom"}
    assert g.mode == "collective" and "mode" not in point  # collectives.parquet has no mode column


@pytest.mark.parametrize("make", [lambda: train_cell(), serve_cell, group,
                                  lambda: group().point("reference", "all_reduce", "bf16", 2048)])
def test_every_mode_refuses_a_status_outside_the_vocabulary(make):
    with pytest.raises(ContractError, match="not one of ok, failed, timeout, skipped"):
        start_row(make(), status="crashed", reason="x")


@pytest.mark.parametrize("make", [serve_cell, group, lambda: group().point("sweep", "broadcast", "fp32", 1024)])
def test_the_specs_are_frozen_and_keyword_only(make):
    s = make()
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.mode = "train"
    with pytest.raises(TypeError):
        type(s)(*dataclasses.astuple(s))


def test_a_collective_group_round_trips_through_its_plan_file():
    g = group()
    back = contract.load(CollectiveGroupSpec, contract.dump(g))
    assert back == g and back.sizes == (1024, 2048)
    with pytest.raises(ContractError, match="sizes"):
        contract.load(CollectiveGroupSpec, {**dataclasses.asdict(g), "sizes": "1K"})


def test_the_row_start_is_light_enough_for_the_collective_ranks():
    code = ("import sys, bench.results.identity; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'numpy', 'scipy', 'pandas', 'torch'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_a_spec_keeps_its_own_mode():
    with pytest.raises(ContractError, match="mode"):
        contract.load(CollectiveGroupSpec, {**dataclasses.asdict(group()), "mode": "train"})
