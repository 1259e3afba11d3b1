"""The collective sweep on gloo/CPU at world sizes 2 and 4 (one torchrun per world size), the
correctness check against a simulated collective, and the CLI's input errors."""

from __future__ import annotations

import argparse
import json

import pandas as pd
import pytest
import torch

from bench.cli.comm import config_from_args, parse_bytes, register
from bench.comm.sweep import CommConfig, run_sweep
from bench.comm.worker import OPS, Op, size_ladder
from bench.core.errors import UserError

# nccl-tests' busbw/algbw factors, written out for n = 2 and 4 (not computed by the code under test)
FACTORS = {2: {"all_reduce": 1.0, "all_gather": 0.5, "reduce_scatter": 0.5, "broadcast": 1.0, "all_to_all": 0.5,
               "sendrecv": 1.0},
           4: {"all_reduce": 1.5, "all_gather": 0.75, "reduce_scatter": 0.75, "broadcast": 1.0, "all_to_all": 0.75,
               "sendrecv": 1.0}}


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> tuple[pd.DataFrame, dict]:
    cfg = CommConfig(backends=["gloo"], world_sizes=[2, 4], device="cpu", min_bytes=2**10, max_bytes=2**16,
                     factor=4, iters=2, warmup=1, budget_s=0.0, group_timeout_s=120,
                     out=str(tmp_path_factory.mktemp("comm")))
    run_dir = run_sweep(cfg)
    return pd.read_parquet(run_dir / "collectives.parquet"), json.loads((run_dir / "meta.json").read_text())


@pytest.mark.distributed
def test_every_point_measured_and_correct(sweep):
    df, _ = sweep
    s = df[df["kind"] == "sweep"]
    assert (s["status"] == "ok").all(), s[s["status"] != "ok"][["world_size", "op", "reason"]].to_string()
    assert set(s["world_size"]) == {2, 4} and set(s["op"]) == set(OPS) and set(s["dtype"]) == {"fp32", "bf16"}
    assert len(s) == 2 * len(OPS) * 2 * len(size_ladder(2**10, 2**16, 4))
    assert (s["wrong"] == 0).all()
    assert (s["time_s"] > 0).all() and (s["time_max_s"] >= s["time_s"] * (1 - 1e-9)).all()


@pytest.mark.distributed
def test_bandwidths_follow_nccl_tests_definitions(sweep):
    df, _ = sweep
    s = df[df["kind"] == "sweep"]
    assert s["algbw_gbs"].to_numpy() == pytest.approx((s["bytes"] / s["time_s"] / 1e9).to_numpy(), rel=1e-9)
    for (n, op), g in s.groupby(["world_size", "op"]):
        assert (g["busbw_gbs"] / g["algbw_gbs"]).to_numpy() == pytest.approx(FACTORS[n][op], rel=1e-9)
    # all_gather / reduce_scatter / all_to_all: S is the total array, split evenly over ranks
    split = s[s["op"].isin(["all_gather", "reduce_scatter", "all_to_all"])]
    assert (split["count"] % split["world_size"] == 0).all()


@pytest.mark.distributed
def test_reference_rows_and_run_folder(sweep):
    df, meta = sweep
    ref = df[df["kind"] == "reference"]
    assert len(ref) == 4 and (ref["bytes"] == 2**16).all() and (ref["busbw_gbs"] > 0).all()
    top = df[(df["kind"] == "sweep") & (df["op"] == "all_reduce") & (df["bytes"] == 2**16)]
    assert top["vs_reference"].notna().all() and top["reference_busbw_gbs"].gt(0).all()
    assert meta["config"]["world_sizes"] == [2, 4] and meta["topology"]["available"] is False


def _simulate(name: str, n: int, dtype=torch.bfloat16) -> list[Op]:
    """Every rank's Op after the collective, computed in-process from the other ranks' inputs."""
    ops = [Op(name, 4 * 2**10, dtype, torch.device("cpu"), r, n) for r in range(n)]
    for o in ops:
        o.fill()
    m = ops[0].chunk
    ins = [o.inp.clone() for o in ops]  # all_reduce and broadcast work in place
    for r, o in enumerate(ops):
        if name == "all_reduce":
            o.out.copy_(sum(x.float() for x in ins).to(dtype))
        elif name == "all_gather":
            o.out.copy_(torch.cat(ins))
        elif name == "reduce_scatter":
            o.out.copy_(sum(x[r * m:(r + 1) * m].float() for x in ins).to(dtype))
        elif name == "broadcast":
            o.out.copy_(ins[0])
        elif name == "all_to_all":
            o.out.copy_(torch.cat([x[r * m:(r + 1) * m] for x in ins]))
        else:
            o.out.copy_(ins[(r - 1) % n])
    return ops


@pytest.mark.parametrize("name", OPS)
def test_check_counts_wrong_elements(name):
    ops = _simulate(name, 4)
    assert [o.wrong() for o in ops] == [0, 0, 0, 0]
    victim = ops[1]
    victim.out[3] += 1
    victim.out[-1] = 100
    assert victim.wrong() == 2


def _args(**kw) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="cmd"))
    argv = ["comm"] + [x for k, v in kw.items() for x in (f"--{k.replace('_', '-')}", str(v))]
    return parser.parse_args(argv)


@pytest.mark.parametrize("kw, words", [
    ({"world_sizes": "1"}, "at least 2"), ({"backends": "mpi"}, "mpi"), ({"max_bytes": "1Q"}, "1Q"),
    ({"backends": "nccl"}, "--device cuda"), ({"ops": "allreduce"}, "all_reduce"),
    ({"min_bytes": "1M", "max_bytes": "1K"}, "min <= max"), ({"factor": 3}, "2 or 4")])
def test_bad_flags_are_one_line_user_errors(kw, words):
    with pytest.raises(UserError, match=words) as e:
        config_from_args(_args(device="cpu", **kw), gpus=0)
    assert "\n" not in str(e.value)


def test_flags_to_config():
    cfg = config_from_args(_args(device="cpu", world_sizes="4,2", max_bytes="64K", ops="all_reduce,sendrecv"), gpus=0)
    assert cfg.backends == ["gloo"] and cfg.world_sizes == [2, 4] and cfg.ops == ["all_reduce", "sendrecv"]
    assert cfg.sizes() == size_ladder(1024, 65536, 2) and cfg.sizes()[-1] == 65536
    assert parse_bytes("1G", "--max-bytes") == 2**30 and parse_bytes("3000", "x") == 3000
    assert size_ladder(1024, 5000, 4) == [1024, 4096, 5000]
