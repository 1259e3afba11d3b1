"""The estimate an unbudgeted run prints before it starts (bench.plan.estimate)."""

from __future__ import annotations

from bench.core.config import build_config
from bench.plan import estimate
from bench.plan.matrix import plan


def _cells(**flags):
    cfg = build_config(toml=None, flags={"device": "cpu", "budget": "off", **flags}, gpus=0)
    return cfg, plan(cfg, 0)[0]


def test_a_large_model_on_a_cpu_is_warned_about_before_it_starts():
    """gpt-200m at world sizes 1, 2 and 4 on two cores started without a word and showed nothing
    after 90 s: at 50 GFLOP/s a rank, each of its steps takes minutes."""
    cfg, cells = _cells(workloads="gpt-200m", world_sizes="1,2,4")
    est = estimate.estimate_s(cfg, cells, 50e9)
    line = estimate.estimate_line(cfg, cells, est)
    assert est[0] > estimate.WARN_S and est[1] > 0
    assert "that is past 10 minutes: --budget 10m fits the run into 10" in line
    assert f"{est[1]} of them would pass the 120 s cell timeout and be cut" in line


def test_a_small_run_is_estimated_without_a_warning():
    cfg, cells = _cells(workloads="mlp", strategies="single,ddp", world_sizes="2", steps=5, warmup=1)
    est = estimate.estimate_s(cfg, cells, 50e9)
    line = estimate.estimate_line(cfg, cells, est)
    assert est[0] < 60 and est[1] == 0 and "past" not in line and line.startswith("parbench run: 2 cells to measure")


def test_the_cpu_rate_is_measured():
    assert 1e8 < estimate.cpu_rate(1, seconds=0.05) < 1e13


def test_a_compiled_run_is_estimated_with_its_compilation():
    """Two compiled gpt-200m cells of 3 repeats on one H200 were estimated at 45 s and had not
    finished one repeat round in 290 s: each repeat compiles its model again."""
    from bench.plan.budget import COMPILE_S

    flags = dict(workloads="mlp", strategies="single", world_sizes="1", steps=5, warmup=1, repeats=3)
    cfg, eager = _cells(**flags)
    cfg_c, compiled = _cells(training={"compile": "on"}, **flags)
    plain, with_compile = estimate.estimate_s(cfg, eager, 50e9), estimate.estimate_s(cfg_c, compiled, 50e9)
    assert with_compile[0] - plain[0] == 3 * COMPILE_S["cpu"]
    assert "compiling included" in estimate.estimate_line(cfg_c, compiled, with_compile)
    assert "compiling" not in estimate.estimate_line(cfg, eager, plain)
