"""A Hugging Face model (``hf:llama``, tiny) through the real harness on gloo/CPU: one device, DDP,
FSDP2 (one unit per decoder layer), the model's declared tensor-parallel plan and a 1F1B pipeline
cut between its layers, each at world size 2, each matching one device. One run for the module;
a longer check on two real ranks compares qwen3's tensor-parallel gradients with one device's."""

from __future__ import annotations

from datetime import timedelta

import pandas as pd
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from bench.results.run import load_run
from bench.runtime.process import free_port
from tests.distributed.runs import QUICK, run

pytestmark = [pytest.mark.distributed, pytest.mark.long]  # a run of its own: 26 s on 2 cores
pytest.importorskip("transformers")

LAYERS = 2
WORKLOAD = (f"hf:llama[hidden_size=64,num_hidden_layers={LAYERS},num_attention_heads=4,num_key_value_heads=2,"
            "intermediate_size=128,vocab_size=256,seq_len=32,global_batch=8]")
STRATEGIES = ("single", "ddp", "fsdp", "tensor", "pipeline-1f1b")
SHOW = ["strategy", "world_size", "status", "parity_ok", "parity_rel_err", "reason"]


@pytest.fixture(scope="module")
def cells(tmp_path_factory) -> pd.DataFrame:
    """Every strategy above on the tiny llama at world size 2 (3 steps after 1 warm-up, not
    profiled: parity and the split are under test, not the breakdown)."""
    out = run(tmp_path_factory.mktemp("hf"), workloads=WORKLOAD, strategies=",".join(STRATEGIES), world_sizes="2",
              steps=3, warmup=1, profile_steps=0, **QUICK)
    return load_run(out)[0].set_index("strategy")


def test_every_strategy_runs_the_hf_model_and_matches_one_device(cells):
    assert sorted(cells.index) == sorted(STRATEGIES), cells.reset_index()[SHOW].to_string()
    assert (cells["status"] == "ok").all(), cells.reset_index()[SHOW].to_string()
    assert cells["parity_ok"].all(), cells.reset_index()[SHOW].to_string()
    assert cells.loc[list(STRATEGIES[1:]), "world_size"].eq(2).all()
    assert cells["workload"].str.startswith("hf:llama(").all()


def test_each_strategy_split_the_hf_model_where_it_should(cells):
    assert cells.loc["fsdp", "fsdp_units_built"] == LAYERS  # one unit per decoder layer
    assert cells.loc["fsdp", "param_share"] <= 1.25 / 2
    assert cells.loc["pipeline-1f1b", "stage_blocks"] == "2/2"  # embedding + layer | layer + head
    assert cells.loc["tensor", "param_share"] < 0.95 and cells.loc["tensor", "mesh"] == "tp2"
    assert cells.loc[list(STRATEGIES[1:]), "comm_calls_per_step"].gt(0).all()


def _qwen3_gradients_match_one_device(rank: int, port: int) -> None:
    """On each of 2 gloo ranks: qwen3 split by its declared plan takes one backward step, and every
    gradient (its shard of a split one) equals the one-device model's. The per-head q_norm and
    k_norm, whole on each rank but fed its heads only, match only once summed over the ranks."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, distribute_tensor

    from bench.workloads import resolve

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=timedelta(seconds=60))
    try:
        wl = resolve("hf:qwen3", hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                     intermediate_size=64, vocab_size=128, seq_len=8, global_batch=4)
        x, y = wl.batch(0)
        one = wl.build(torch.device("cpu"))
        wl.loss(one(x), y).backward()
        mesh = init_device_mesh("cpu", (2,))
        split = wl.build(torch.device("meta"))
        wl.tp_plan(split, mesh)
        split.to_empty(device="cpu")
        wl.init(split)
        wl.loss(split(x), y).backward()
        for name, p in split.named_parameters():
            want = one.get_parameter(name).grad
            if isinstance(p, DTensor):
                want = distribute_tensor(want, mesh, p.placements, src_data_rank=None).to_local()
            got = p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}")
    finally:
        dist.destroy_process_group()


@pytest.mark.long  # two ranks started for one check
def test_qwen3_tensor_parallel_gradients_match_one_device():
    mp.spawn(_qwen3_gradients_match_one_device, args=(free_port(),), nprocs=2)
