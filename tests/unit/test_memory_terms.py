"""The arithmetic of the strategies' memory terms (strategies.memory) and the layout the planner
records for them (Workload.layout_facts), without processes."""

from __future__ import annotations

import dataclasses

import pytest

import strategies
from bench.workloads.base import TP_PLANS
from bench.workloads.registry import planned
from strategies.catalog import TP_PLAN
from strategies.memory import (
    Param,
    chunk,
    held,
    largest_bucket,
    layout,
    local_elements,
    pipeline_in_flight,
    shares,
    zero_partition,
)


def p(*shape: int, block: int = 0, trainable: bool = True, element: int = 4) -> Param:
    return Param(block=block, element=element, trainable=trainable, shape=shape)


def test_chunk_is_torch_chunks_largest_piece():
    assert [chunk(10, n) for n in (1, 2, 3, 4, 11)] == [10, 5, 4, 3, 1]


def test_local_elements_cuts_tensor_parallel_then_pads_fsdp_rows():
    assert local_elements((509, 256), dp=4) == 128 * 256  # FSDP2: ceil(509 / 4) rows on every rank
    assert local_elements((64, 256), tp_dim=1, tp=2) == 64 * 128  # a row-wise linear's weight
    assert local_elements((192, 64), tp_dim=0, tp=2, dp=2) == 48 * 64  # TP rows, then FSDP's of those
    assert local_elements((10,), dp=4) == 3 and local_elements((), dp=4) == 1


def test_zero_partition_is_greedy_largest_first():
    ps = [p(10), p(6), p(5), p(3)]
    assert zero_partition(ps, 2) == [[0, 3], [1, 2]]  # 10 -> r0, 6 -> r1, 5 -> r1 (6 < 10), 3 -> r0 (10 < 11)
    ranks = [held([ps[i] for i in owned]) for owned in zero_partition(ps, 2)]
    assert shares(ranks, ps)[2] == pytest.approx(13 / 24)  # the fullest rank's state, not 1/2


def test_held_counts_no_gradient_or_state_for_frozen_parameters():
    ps = [p(4), p(4, trainable=False)]
    h = held(ps)
    assert (h.params, h.grads, h.state) == (32, 16, 16)
    assert shares([h], ps) == (1.0, 1.0, 1.0)


def test_largest_bucket_follows_the_greedy_consecutive_buckets():
    assert largest_bucket([4, 4, 4], 100) == 12
    assert largest_bucket([4, 4, 4], 8) == 8
    assert largest_bucket([2, 30, 2], 8) == 30  # a tensor over the cap has a bucket of its own


def test_in_flight_by_schedule():
    assert pipeline_in_flight("gpipe", 4, 8, 1) == 8
    assert pipeline_in_flight("1f1b", 4, 8, 1) == 4 and pipeline_in_flight("1f1b", 4, 2, 1) == 2
    assert pipeline_in_flight("1f1b", 4, 8, 1, rank=3) == 1
    # interleaved, 2 ranks x 2 stages, 4 micro-batches: (2-1) x 2 + 2 x (2-1) warm-up forwards, one more
    assert pipeline_in_flight("interleaved-1f1b", 2, 4, 2) == 5


def test_tp_plans_are_the_options_choices():
    assert tuple(TP_PLAN.choices) == TP_PLANS


@pytest.fixture(scope="module")
def gpt():
    return planned("gpt-tiny", {}, seed=0, global_batch=None, timeout_s=60)[1]


def test_layout_facts_of_the_gpt(gpt):
    ps = layout(gpt)
    assert sum(x.nbytes for x in ps) == gpt.train_bytes - gpt.trainable_bytes
    assert {x.block for x in ps} == set(range(gpt.n_blocks))
    assert len(gpt.boundary_bytes) == gpt.n_blocks
    assert gpt.boundary_bytes[0] == 32 * 64 * 4  # one sample's hidden states: T x d fp32
    meg, sp = gpt.tp_dims["megatron"], gpt.tp_dims["sp"]
    assert len(meg) == len(ps) and {0, 1, -1} == set(meg)
    assert sum(d >= 0 for d in sp) == sum(d >= 0 for d in meg) + 1  # sp also splits the head


def cell_of(facts, strategy: str, n: int, **options):
    from bench.core.knobs import Training
    from bench.core.spec import CellSpec, Measure

    strat = strategies.get(strategy)
    return CellSpec(cell_id=0, workload=facts, strategy=strategy, strategy_spec=strategy, backend="gloo",
                    device="cpu", n_devices=n, n_procs=strat.procs(n), devices=(),
                    options=strat.resolve_options(n, options), labels={}, role="",
                    measure=Measure(steps=1, warmup=1, profile_steps=0, precision="fp32", seed=0),
                    training=Training())


def test_terms_differ_from_the_naive_shares(gpt):
    t = strategies.get("tensor").memory_terms(cell_of(gpt, "tensor", 2))
    assert 0.5 < t.params < 1 and t.micro_batch == gpt.global_batch
    ddp = strategies.get("ddp").memory_terms(cell_of(gpt, "ddp", 2))
    assert ddp.buffers == gpt.trainable_bytes and ddp.params == 1.0
    view = strategies.get("ddp").memory_terms(cell_of(gpt, "ddp", 2, ddp_grad_as_bucket_view=True))
    assert view.buffers == 0
    fsdp = strategies.get("fsdp").memory_terms(cell_of(gpt, "fsdp", 2))
    assert fsdp.params == 0.5 and fsdp.how == "approximate" and fsdp.buffers > 0
    assert strategies.get("fsdp-noreshard").memory_terms(cell_of(gpt, "fsdp-noreshard", 2)).buffers >= fsdp.buffers
    pipe = strategies.get("pipeline-gpipe").memory_terms(cell_of(gpt, "pipeline-gpipe", 2))
    assert pipe.params > 0.5 and pipe.in_flight == pipe_m(gpt, 2) and pipe.buffers > 0


def pipe_m(facts, n: int) -> int:
    return strategies.get("pipeline-gpipe").resolve_options(n, {})["micro_batches"]


def test_without_a_layout_the_terms_are_approximate(gpt):
    bare = dataclasses.replace(gpt, param_shapes=None, boundary_bytes=None, tp_dims=None)
    for name in ("ddp-zero1", "fsdp", "tensor", "chain", "pipeline-1f1b"):
        assert strategies.get(name).memory_terms(cell_of(bare, name, 2)).how == "approximate", name
