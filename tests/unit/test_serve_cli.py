"""`parbench serve` flags (bad input is a one-line error, exit 2) and the rate sweep's search."""

from __future__ import annotations

import argparse

import pytest

from bench.cli.main import main as parbench
from bench.cli.serve import config_from_args, register
from bench.core.errors import UserError
from bench.serve.config import ServeConfig
from bench.serve.sweep import run_sweep


def _args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    register(p.add_subparsers(dest="cmd"))
    return p.parse_args(["serve", *argv])


def test_defaults_and_parsing():
    cfg = config_from_args(_args("--workload", "gpt-tiny[n_layer=4]", "--rates", "10,40", "--clients", "2",
                                 "--tenants", "a:rate=3;b:rate=1,size=pareto", "--slow", "1=20"), gpus=0)
    assert cfg.device == "cpu" and cfg.dims == {"n_layer": 4} and cfg.world_sizes == [2]
    assert [t.name for t in cfg.tenants] == ["a", "b"] and cfg.slow == {1: 0.02}
    levels = cfg.levels()
    assert [lv.label for lv in levels] == ["2tenants-poisson@10/s", "2tenants-poisson@40/s", "closed@2"]
    assert sum(t.rate for t in levels[1].tenants) == pytest.approx(40)  # ratios kept, total scaled
    assert levels[1].tenants[0].rate == pytest.approx(30)


@pytest.mark.parametrize("argv", [
    ["--placements", "replicas,magic"], ["--policies", "fastest"], ["--rates", "ten"], ["--rates", "-5"],
    ["--world-sizes", "1.5"], ["--workload", "gpt-tiny[n_layer=x]"], ["--slow", "one=5"], ["--device", "cuda"],
    ["--noisy-rates", "5"], ["--task", "dance"], ["--arrival", "uniform"],
    # values that would otherwise run the launcher out of memory (1e9 requests drawn up front), end
    # in a traceback, or fail every cell
    ["--rates", "1e9", "--duration", "1"], ["--rates", "inf"], ["--rates", "nan"], ["--cell-timeout", "0"],
    ["--cell-timeout", "-1"], ["--requests", "-3"],
    # policies balance replicas only: with no replicas placement they would be silently ignored
    ["--placements", "pipeline", "--policies", "batch"], ["--policies", ""], ["--policies", " , "],
    ["--size-min", "9", "--size-max", "3"], ["--size-min", "0"], ["--arrival", "gamma", "--cv", "0"],
    # empty or meaningless values, which would otherwise run as if the flag were not given
    ["--rates", ""], ["--rates", ","], ["--clients", ""], ["--slo-ms", "-5"], ["--slo-ms", "nan"],
    ["--sample-hz", "-1"], ["--graphs", "fast"], ["--graphs", ""],
])
def test_bad_input_is_a_user_error(argv):
    with pytest.raises(UserError):
        config_from_args(_args(*argv), gpus=0)


def test_errors_of_the_one_tenant_the_flags_make_name_the_flags():
    for argv, flag in ((["--size-min", "9", "--size-max", "3"], "--size-min 9 and --size-max 3"),
                       (["--size-min", "0"], "--size-min 0 must be >= 1"),
                       (["--arrival", "gamma", "--cv", "-1"], "--cv -1.0 must be from 0.01 to 100")):
        with pytest.raises(UserError, match="^" + flag) as e:
            config_from_args(_args(*argv), gpus=0)
        assert "tenant t0" not in str(e.value)


def test_policies_stand_beside_replicas_and_default_when_not_given():
    assert config_from_args(_args("--placements", "pipeline"), gpus=0).policies == ["round-robin", "jsq"]
    cfg = config_from_args(_args("--placements", "replicas,pipeline", "--policies", "batch"), gpus=0)
    assert cfg.policies == ["batch"]


def test_graphs_go_to_cuda_replicas_that_score_or_classify():
    cuda = ServeConfig(device="cuda")
    assert cuda.graphs_for("replicas", "score") and cuda.graphs_for("pinned-tenants", "classify")
    # a KV cache that grows each step, nn.DataParallel's scatter and a pipeline's host hand-over stay eager
    assert not cuda.graphs_for("replicas", "generate")
    assert not cuda.graphs_for("dataparallel-infer", "score") and not cuda.graphs_for("pipeline", "score")
    assert not ServeConfig(device="cpu").graphs_for("replicas", "score")
    assert not ServeConfig(device="cuda", graphs="off").graphs_for("replicas", "score")


def test_main_exits_2_with_one_line(capsys):
    assert parbench(["serve", "--policies", "fastest"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("parbench: error: --policies") and "\n" not in err


def test_sweep_finds_the_highest_passing_rate():
    capacity = 100.0  # a fake server: p99 meets the target below this rate

    def cell(load):
        ok = load.rate < capacity
        return {"status": "ok", "slo_met": ok, "latency_p99_s": 0.01 if ok else 1.0}

    cfg = ServeConfig(rates=[10.0], slo_ms=50.0)
    found = run_sweep(cell, cfg, None)
    rates = [t["rate"] for t in found["tried"]]
    # doubling until the first failure, then bisection between 80 (pass) and 160 (fail)
    assert rates == [10, 20, 40, 80, 160, 120, 100, 90]
    assert found["max_rate_rps"] == 90 and found["first_failing_rps"] == 100


def test_sweep_with_nothing_passing_says_so():
    found = run_sweep(lambda load: {"status": "ok", "slo_met": False}, ServeConfig(slo_ms=1.0), None)
    assert found["max_rate_rps"] is None and found["note"]


def test_unknown_workload_or_task_exits_2_and_leaves_no_run_folder(tmp_path, capsys):
    assert parbench(["serve", "--workload", "nope", "--out", str(tmp_path)]) == 2
    assert parbench(["serve", "--workload", "convnet", "--task", "generate", "--out", str(tmp_path)]) == 2
    assert "--task" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_a_forward_that_raises_or_hangs_is_one_line_before_any_pool(tmp_path, capsys):
    """The parity reference runs the model on one device before any pool: a model that raises is
    one line there, and one that hangs is stopped at --cell-timeout with one line."""
    base = ["--device", "cpu", "--world-sizes", "2", "--duration", "1", "--rates", "5", "--out", str(tmp_path)]
    assert parbench(["serve", "--workload", "tests.helpers:forward_raises", *base]) == 2
    err = capsys.readouterr().err.strip()
    assert "its forward failed on one device before serving (RuntimeError: forward exploded on purpose)" in err
    assert "\n" not in err
    assert parbench(["serve", "--workload", "tests.helpers:forward_hangs", "--cell-timeout", "1", *base]) == 2
    err = capsys.readouterr().err.strip()
    assert "did not answer the 6 parity probes within --cell-timeout 1 s" in err and "\n" not in err
    assert list(tmp_path.iterdir()) == []  # no run folder


def test_an_unwritable_out_is_one_line(capsys):
    assert parbench(["serve", "--device", "cpu", "--out", "/proc/parbench-serve"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--out '/proc/parbench-serve' is not writable" in err and "\n" not in err


def test_nan_answers_are_not_parity():
    """max(0.0, nan) is 0.0: a model answering NaN must not read as perfect parity."""
    import torch

    from bench.serve.run import parity_err

    ref = [torch.ones(3)]
    assert parity_err(ref, {0: [torch.ones(3)]}) == 0.0
    assert parity_err(ref, {0: [torch.full((3,), float("nan"))]}) == float("inf")
    assert parity_err([torch.full((3,), float("nan"))], {0: [torch.ones(3)]}) == float("inf")


@pytest.mark.parametrize("best, said", [(960.0, "960 req/s"), (None, "none (no rate tried met the target)")])
def test_the_sweep_line_names_the_offered_rate_or_none(monkeypatch, capsys, best, said):
    import bench.results.run as store
    from bench.cli import serve as cli_serve

    found = {"slo_p99_s": 0.05, "max_rate_rps": best, "note": None if best else "no rate tried met the target"}
    monkeypatch.setattr(store, "load_meta", lambda run_dir: {"serve_sweep": {"replicas/jsq": found}})
    assert cli_serve._report("RUN", []) == 0
    assert capsys.readouterr().out.splitlines()[-1] == \
        f"sweep replicas/jsq: highest offered rate meeting p99 <= 50 ms: {said}"


def test_a_serve_cell_prints_within_100_columns():
    from bench.serve.run import summary_lines

    ok = dict(status="ok", strategy="pinned-tenants", world_size=4, serve_policy="jsq", serve_load="poisson@1000/s",
              serve_achieved_rps=957.25, latency_p50_s=0.01234, latency_p99_s=0.03111, latency_n=700,
              parity_rel_err=1.2e-6, noise="p99 from few requests (n=700 < 1000)")
    bad = dict(ok, status="failed", reason="RuntimeError: pool did not start")
    (a, b) = summary_lines([ok, bad])
    lines = a.splitlines() + b.splitlines()
    assert max(map(len, lines)) <= 100, lines
    assert "957.2 req/s  p50   12.34 ms  p99   31.11 ms" in lines[0] and "n=700  parity 1.2e-06  (!)" in lines[1]
    assert lines[2].endswith(" failed") and lines[3] == "    RuntimeError: pool did not start"
    short = dict(ok, latency_p50_s=float("nan"), latency_p99_s=float("nan"), latency_n=7, noise=None,
                 latency_refused="p50 (needs 11), p90 (needs 64), p95 (needs 130), p99 (needs 662)")
    (c,) = summary_lines([short])
    assert "p50     -   ms  p99     -   ms" in c and c.endswith("too few requests for p50 (needs 11), p99 (needs 662)")


@pytest.mark.parametrize("flags, needle", [
    (["--arrival", "gamma", "--cv", "1e-300"], "--cv 1e-300 must be from 0.01 to 100"),
    (["--sample-hz", "1e-300"], "--sample-hz 1e-300 must be 0 (off) or from 0.01 to 1000"),
])
def test_values_that_overflow_the_load_generator_or_stop_the_sampler_are_refused(tmp_path, capsys, flags, needle):
    """A gamma shape of 1/cv^2 = 1e600 overflowed inside numpy; a period of 1e300 s killed the
    sampler thread while the run went on."""
    assert parbench(["serve", "--device", "cpu", "--workload", "mlp", "--out", str(tmp_path), *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and "\n" not in err, err
    assert list(tmp_path.iterdir()) == []
