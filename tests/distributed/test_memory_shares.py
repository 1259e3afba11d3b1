"""The parameters, gradients and optimizer state each strategy declares it holds
(``Strategy.memory_terms``, the rows' ``mem_pred_*_bytes``) against what each gloo rank counted of
its optimizer's tensors (``held_*_bytes``, the largest count over the ranks), for every strategy that
runs on CPU at world sizes 2 and 4.

Two workloads: gpt-tiny with 6 layers (8 blocks: 4 ranks x 2 interleaved stages; the
tensor-parallel plans; uneven pipeline cuts, the embedding and head riding along) and an MLP whose
widths do not divide by 4 (FSDP2 pads each shard to ceil(rows / n); ZeroRedundancyOptimizer's
greedy partition is uneven). Every strategy declares these three shares exactly (what is
approximate in its terms is its buffers or activations, which no ``held_*`` column counts), so they
must agree to float rounding: ``REL`` below. A prediction that assumed the naive share (a whole
copy, or 1/n for a strategy that cuts the model) is caught: the test also requires that, for every
strategy where the naive share is wrong on some cell, the counts differ from it there.

World size 2 runs in the default suite (about 60 s on 2 idle cores); world size 4 is ``long``.
"""

from __future__ import annotations

import math

import pandas as pd
import pytest

import strategies
from bench.results.run import load_run
from tests.distributed.runs import QUICK, run

pytestmark = [pytest.mark.distributed]

GPT = "gpt-tiny[n_layer=6]"
ODD = "mlp[width=509,d_out=10]"
#: Every strategy that runs on CPU (dataparallel and layersplit need several GPUs in one process).
CPU = ("ddp", "ddp-zero1", "allreduce", "allreduce-bucketed", "fsdp", "fsdp-noreshard", "chain", "pipeline-gpipe",
       "pipeline-1f1b", "pipeline-interleaved", "tensor", "dp-pp", "fsdp-tp", "ensemble", "encoder-head")
#: Where the odd MLP tells something the GPT does not: padding and an uneven state partition.
ODD_STRATEGIES = ["fsdp", "fsdp-noreshard", "ddp-zero1"]
#: Where a naive share (1.0, or 1/n for a strategy that cuts the model) is wrong on some cell.
NOT_NAIVE = {2: {"ddp-zero1", "fsdp", "fsdp-noreshard", "chain", "pipeline-gpipe", "pipeline-1f1b",
                 "pipeline-interleaved", "tensor", "encoder-head"},
             4: {"ddp-zero1", "fsdp", "fsdp-noreshard", "chain", "pipeline-gpipe", "pipeline-1f1b",
                 "pipeline-interleaved", "tensor", "dp-pp", "fsdp-tp"}}
#: Float rounding of share x total: the shares are exact.
REL = 1e-9
PARTS = ("params", "grads", "optimizer")
#: Which strategies can run at each world size on CPU.
RUNS_AT = {2: [s for s in CPU if s not in ("dp-pp", "fsdp-tp")], 4: [s for s in CPU if s != "encoder-head"]}


def shares_run(tmp_path, world: int) -> pd.DataFrame:
    """One parbench run of every CPU strategy at ``world`` on both workloads, with the one-device
    reference (AdamW: its two state values a parameter make the state share visible), one warm-up
    and one timed step."""
    d = run(tmp_path, workloads=f"{GPT},{ODD}", strategies=",".join(["single", *RUNS_AT[world]]),
            world_sizes=f"1,{world}", steps=1, warmup=1, warmup_max=0, steps_max=0, repeats=1, profile_steps=0,
            workload_matrix={ODD: {"strategies": ["single", *ODD_STRATEGIES]}}, **QUICK)
    return load_run(d)[0]


def naive(strategy: str, world: int) -> float:
    """The share a prediction would assume without looking: a whole copy, or 1/n where the model is cut."""
    return 1 / world if strategies.get(strategy).cuts else 1.0


def check(cells: pd.DataFrame, world: int) -> None:
    """Every cell at ``world`` ran, its three counts equal its predictions, and the strategies of
    :data:`NOT_NAIVE` held other than the naive share on some cell."""
    whole = cells[cells["strategy"] == "single"].set_index("workload")["held_params_bytes"]
    cells = cells[cells["world_size"] == world]
    bad = cells[cells["status"] != "ok"]
    assert bad.empty, bad[["workload", "strategy", "status", "reason"]].to_string()
    assert set(cells["strategy"]) == set(RUNS_AT[world])
    off, refuted = [], set()
    for _, row in cells.iterrows():
        for part in PARTS:
            got, want = row[f"held_{part}_bytes"], row[f"mem_pred_{part}_bytes"]
            if not math.isclose(got, want, rel_tol=REL):
                off.append(f"{row['workload']} {row['strategy']} {part}: held {got:.0f}, predicted {want:.0f}")
        n, total = naive(row["strategy"], world), whole[row["workload"]]
        counted = (row["held_params_bytes"] / total, row["held_optimizer_bytes"] / (2 * total))
        if not all(math.isclose(c, n, rel_tol=REL) for c in counted):
            refuted.add(row["strategy"])
    assert not off, "\n".join(off)
    assert NOT_NAIVE[world] <= refuted, f"naive shares not refuted for {sorted(NOT_NAIVE[world] - refuted)}"


@pytest.mark.long  # every strategy started at two ranks: 30 s on 2 cores
def test_held_shares_match_at_world_size_2(tmp_path):
    check(shares_run(tmp_path, 2), 2)


@pytest.mark.long  # four ranks started for every strategy
def test_held_shares_match_at_world_size_4(tmp_path):
    check(shares_run(tmp_path, 4), 4)
