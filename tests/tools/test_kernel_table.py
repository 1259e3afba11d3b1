"""tools/kernel_table.py on a run folder written by hand: kinds, per-step figures, the lookup."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from tools import kernel_table


def k(name, ts, dur):
    return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur}


def test_kernel_kinds_per_step_and_the_cell_lookup(tmp_path, capsys):
    (tmp_path / "traces").mkdir()
    pd.DataFrame([{"cell_id": 3, "workload": "gpt-200m(global_batch=64)", "strategy": "ddp", "world_size": 4,
                   "status": "ok", "step_time_median_s": 0.05, "profiled_step_s": 0.052, "repeats_done": 3}]
                 ).to_parquet(tmp_path / "cells.parquet")
    trace = {"traceEvents": [
        k("sm90_xmma_gemm_bf16", 0, 3000), k("ncclDevKernel_AllReduce_Sum", 3000, 1000),
        k("pytorch_flash::flash_fwd_kernel", 4000, 2000), k("vectorized_elementwise_kernel<gelu>", 6000, 400),
        k("sm90_xmma_gemm_bf16", 7000, 1000), {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 9}]}
    (tmp_path / "traces" / "cell3-rank0-gpu.json").write_text(json.dumps(trace))
    t = kernel_table.kernel_kinds(trace, steps=2)
    assert t.loc["matmul", "ms"] == pytest.approx(2.0) and t.loc["matmul", "launches"] == 1
    assert set(t.index) == {"matmul", "communication", "attention", "elementwise"}
    assert kernel_table.main([str(tmp_path), "--cell", "gpt-200m/ddp/4", "--json", str(tmp_path / "k.json")]) == 0
    out = capsys.readouterr().out
    assert "| matmul | 2.00 (1) |" in out and "| timed median ms | 50.00 |" in out
    assert json.loads((tmp_path / "k.json").read_text())["gpt-200m/ddp/4"]["repeats"] == 3
    with pytest.raises(SystemExit, match="fsdp"):
        kernel_table.main([str(tmp_path), "--cell", "gpt-200m/fsdp/4"])
