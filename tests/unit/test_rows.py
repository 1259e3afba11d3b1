"""The one row builder, on fake rank data: statistics, MFU, the energy window rule, strategy
metrics and extras, failure rows."""

import json
import math

import pytest

from bench.core.metrics import Metric
from bench.core.spec import CellSpec, Measure, RankMeasurement, WorkloadFacts
from bench.results.rows import build_row, failure_row
from strategies.catalog import PIPELINE_METRICS


def spec(*, n=2, device="cuda", precision="bf16", steps=4, warmup=1, flops=1e9, strategy="ddp", labels=None):
    wl = WorkloadFacts(name="w(d=2)", spec="w", dims={"d": 2}, global_batch=8, flops_per_sample=flops, params=10,
                       n_blocks=3, n_heads=None, has_tp_plan=False, description="")
    return CellSpec(cell_id=7, workload=wl, strategy=strategy, strategy_spec=strategy, backend="nccl",
                    device=device, n_devices=n, n_procs=n, devices=tuple(range(n)) if device == "cuda" else (),
                    options={}, labels=labels or {}, role="",
                    measure=Measure(steps=steps, warmup=warmup, profile_steps=0, precision=precision, seed=0))


def rank(r, times, *, window=(100.0, 101.5), energy=50.0, gpu="NVIDIA H100 80GB HBM3", **kw):
    return RankMeasurement(rank=r, times=times, starts=[100.0 + i for i in range(len(times))],
                           losses=[2.0] + [1.0] * len(times), loss_weight=0.5, peak_mem=1e9 * (r + 1),
                           energy_j=energy, window=window, gpu_name=gpu, **kw)


def test_step_time_is_the_slowest_rank_and_statistics_follow():
    row, steps, comm = build_row(spec(), [[rank(0, [0.1, 0.2, 0.1, 0.1]), rank(1, [0.2, 0.1, 0.1, 0.3])]], wall_s=3.0)
    assert row["status"] == "ok" and row["world_size"] == 2 and row["workload"] == "w(d=2)"
    assert row["step_time_median_s"] == pytest.approx(0.2)  # per-step max: 0.2, 0.2, 0.1, 0.3
    assert row["ci_basis"].startswith("steps") and row["repeats_done"] == 1
    assert row["step_time_mean_s"] == pytest.approx(0.2)
    assert row["throughput_samples_s"] == pytest.approx(8 / 0.2)
    assert row["peak_mem_bytes"] == 2e9 and row["loss_final"] == pytest.approx(1.0)
    assert row["overhead_s"] == pytest.approx(3.0 - 0.8)
    assert {s["repeat"] for s in steps} == {0}
    assert len(steps) == 2 * 5 and {s["phase"] for s in steps} == {"warmup", "timed"}
    assert comm == []


def test_mfu_only_for_known_gpus_and_per_device():
    row, _, _ = build_row(spec(), [[rank(0, [0.1] * 4), rank(1, [0.1] * 4)]], wall_s=1.0)
    assert row["mfu"] == pytest.approx(1e9 * 80 / (989.4e12 * 2))
    row, _, _ = build_row(spec(), [[rank(0, [0.1] * 4, gpu="Some GPU"), rank(1, [0.1] * 4, gpu="Some GPU")]],
                          wall_s=1.0)
    assert row["mfu"] is None


def test_energy_needs_a_window_of_one_second():
    row, _, _ = build_row(spec(), [[rank(0, [0.1] * 4), rank(1, [0.1] * 4)]], wall_s=1.0)
    assert row["energy_j"] == 100.0 and row["energy_per_sample_j"] == pytest.approx(100 / 32)
    short = [rank(r, [0.1] * 4, window=(100.0, 100.5)) for r in range(2)]
    row, _, _ = build_row(spec(), [short], wall_s=1.0)
    assert "energy_j" not in row
    cpu, _, _ = build_row(spec(device="cpu"), [[rank(r, [0.1] * 4, gpu=None) for r in range(2)]], wall_s=1.0)
    assert "energy_j" not in cpu and cpu["mfu"] is None


def test_telemetry_window_uses_the_planned_gpus_only():
    from bench.results.rows import telemetry_means

    samples = [{"t": 100.5, "device": "gpu0", "metric": "power_w", "value": 300.0},
               {"t": 100.7, "device": "gpu1", "metric": "power_w", "value": 100.0},
               {"t": 100.7, "device": "gpu3", "metric": "power_w", "value": 999.0},  # not this cell's GPU
               {"t": 99.0, "device": "gpu0", "metric": "power_w", "value": 999.0}]  # before the window
    # another node's gpu0 and host (a multi-node run's samples): not this one-node cell's
    samples += [{"t": 100.6, "device": "gpu0", "metric": "power_w", "value": 999.0, "node": 1},
                {"t": 100.6, "device": "host", "metric": "load1", "value": 999.0, "node": 1}]
    means = telemetry_means(samples, spec(), (100.0, 101.5))
    row, _, _ = build_row(spec(), [[rank(r, [0.1] * 4) for r in range(2)]], wall_s=1.0, telemetry=[means])
    assert row["power_mean_w"] == pytest.approx(200.0) and row["contended"] == ""


def test_power_cap_is_reported_but_only_thermal_or_hardware_slowdowns_mark_contention():
    """A fully loaded GPU sits at its software power cap (0x4) and stays steady (as H100s do); a
    thermal or hardware slowdown (0x8, 0x20, 0x40, 0x80) means something outside the cell slows it."""
    from bench.results.rows import telemetry_means

    def means(reasons):
        samples = [{"t": 100.0 + i / 10, "device": "gpu0", "metric": "throttle_reasons", "value": float(v)}
                   for i, v in enumerate(reasons)]
        return telemetry_means(samples, spec(), (99.0, 102.0))

    capped = means([4, 4, 4, 0])
    assert capped["gpu_power_capped_frac"] == pytest.approx(0.75) and capped["gpu_throttled_frac"] == 0.0
    row, _, _ = build_row(spec(), [[rank(r, [0.1] * 4) for r in range(2)]], wall_s=1.0, telemetry=[capped])
    assert row["contended"] == "" and row["gpu_power_capped_frac"] == pytest.approx(0.75)
    hot = means([4 | 0x20, 0x8, 0, 0])
    assert hot["gpu_throttled_frac"] == pytest.approx(0.5)
    row, _, _ = build_row(spec(), [[rank(r, [0.1] * 4) for r in range(2)]], wall_s=1.0, telemetry=[hot])
    assert "throttled" in row["contended"] and "50%" in row["contended"]


def test_strategy_metrics_combine_as_declared_and_undeclared_go_to_extras():
    declared = [Metric(name="busy_s", dtype="float64", over_ranks="max"),
                Metric(name="sent", dtype="float64", over_ranks="sum"),
                Metric(name="twice", dtype="float64", derive=lambda r: 2 * r["step_time_median_s"])]
    ranks = [rank(0, [0.1] * 4, metrics={"busy_s": 1.0, "sent": 2.0, "mfu": 0.9}),
             rank(1, [0.1] * 4, metrics={"busy_s": 3.0, "sent": 5.0})]
    row, _, _ = build_row(spec(), [ranks], wall_s=1.0, strategy_metrics=declared)
    assert row["busy_s"] == 3.0 and row["sent"] == 7.0 and row["twice"] == pytest.approx(0.2)
    # a value named like a core column cannot overwrite it: it lands, namespaced, in extras
    assert row["mfu"] != 0.9 and json.loads(row["extras"]) == {"ddp.mfu": 0.9}


def test_pipeline_bubble_is_a_strategy_declared_derived_metric():
    ranks = [rank(r, [0.2] * 4, metrics={"stage_busy_s": 0.15 if r else 0.05, "bubble_theory": 0.2}) for r in range(2)]
    row, _, _ = build_row(spec(strategy="pipeline-gpipe"), [ranks], wall_s=1.0, strategy_metrics=PIPELINE_METRICS)
    assert row["stage_busy_s"] == 0.15 and row["bubble_measured"] == pytest.approx(0.25)


def test_the_stage_model_is_the_textbook_bubble_for_equal_stages_and_follows_the_slowest():
    from strategies.pipeline import stage_model

    step, bubble = stage_model([0.8] * 4, m=8)
    assert step == pytest.approx(1.1) and bubble == pytest.approx(3 / 11)
    # A last stage twice as slow: 3 fast stages pass once, the slow one paces the other 7 micro-batches.
    step, bubble = stage_model([0.8, 0.8, 0.8, 1.6], m=8)
    assert step == pytest.approx(0.5 + 7 * 0.2) and bubble == pytest.approx(1 - 1.6 / 1.9)
    ranks = [rank(r, [0.25] * 4, metrics={"stage_busy_s": 0.2, "stage_model_step_s": 0.2}) for r in range(2)]
    row, _, _ = build_row(spec(strategy="pipeline-gpipe"), [ranks], wall_s=1.0, strategy_metrics=PIPELINE_METRICS)
    assert row["pipeline_gap"] == pytest.approx(0.25)


def test_a_failing_rank_fails_the_cell_with_its_rank_and_reason():
    bad = RankMeasurement(rank=1, status="failed", reason="RuntimeError: boom [/x]")
    row, steps, _ = build_row(spec(labels={"mesh": "pp2"}), [[rank(0, [0.1] * 4), bad]], wall_s=2.0)
    assert row["status"] == "failed" and row["reason"] == "rank 1: RuntimeError: boom [/x]"
    assert row["mesh"] == "pp2" and steps == []


def test_nan_loss_fails_the_cell():
    r0 = rank(0, [0.1] * 4)
    r0.losses[2] = math.nan
    row, _, _ = build_row(spec(), [[r0, rank(1, [0.1] * 4)]], wall_s=1.0)
    assert row["status"] == "failed" and "NaN" in row["reason"] and "step 2" in row["reason"]


def test_missing_steps_fail_rather_than_misalign():
    row, _, _ = build_row(spec(), [[rank(0, [0.1] * 4), rank(1, [0.1] * 3)]], wall_s=1.0)
    assert row["status"] == "failed" and "must agree" in row["reason"]


def test_failure_row_carries_the_planned_facts():
    row = failure_row(spec(), status="timeout", reason="no result")
    assert row["status"] == "timeout" and row["global_batch"] == 8 and row["precision"] == "bf16"


def test_a_strategy_declaring_a_core_column_is_refused_when_loaded():
    from strategies.base import Strategy

    with pytest.raises(ValueError, match="declares metric 'mfu', a core column"):
        type("Bad", (Strategy,), {"name": "bad", "metrics": (Metric(name="mfu", dtype="float64"),)})


def test_registry_lists_every_column_once_and_strategy_columns_after_the_core():
    from bench.core.metrics import CORE
    from bench.results.columns import all_metrics

    names = [m.name for m in all_metrics()]
    assert len(names) == len(set(names)) and names[: len(CORE)] == [m.name for m in CORE]
    assert {"bubble_measured", "mesh", "schedule", "micro_batches", "aggregate_s"} <= set(names[len(CORE):])


def test_repeats_give_the_median_over_repeats_and_keep_every_step():
    reps = [[rank(0, [t] * 4), rank(1, [t] * 4)] for t in (0.10, 0.12, 0.11)]
    row, steps, _ = build_row(spec(), reps, wall_s=3.0)
    assert row["step_time_median_s"] == pytest.approx(0.11) and row["repeats_done"] == 3
    assert row["ci_basis"].startswith("repeats") and row["repeat_spread"] == pytest.approx(0.02 / 0.11)
    assert sorted({s["repeat"] for s in steps}) == [0, 1, 2] and len(steps) == 3 * 2 * 5
    assert row["energy_j"] == pytest.approx(300.0)  # every repeat's energy, over every repeat's samples
    assert row["energy_per_sample_j"] == pytest.approx(300.0 / (3 * 4 * 8))


def test_a_failure_in_a_later_repeat_fails_the_cell():
    bad = RankMeasurement(rank=0, status="failed", reason="OOM")
    row, _, _ = build_row(spec(), [[rank(0, [0.1] * 4), rank(1, [0.1] * 4)], [bad, rank(1, [0.1] * 4)]], wall_s=1.0)
    assert row["status"] == "failed" and row["reason"] == "repeat 1, rank 0: OOM"


def test_contention_is_named():
    from bench.results.rows import contention

    assert contention({"host_other_cpu_cores": 1.6, "host_load1": 5.0}, 2).startswith("1.6 cores busy")
    assert "throttled" in contention({"gpu_throttled_frac": 0.5}, 64)
    assert contention({"host_other_cpu_cores": 0.1, "host_load1": 1.0}, 2) == ""
    # two ranks on two cores load them fully by themselves: only load beyond them is contention
    assert contention({"host_other_cpu_cores": 0.1, "host_load1": 2.3}, 2, own=2) == ""
    assert contention({"host_other_cpu_cores": 0.1, "host_load1": 2.3}, 2) == "load 2.3 > 2 cores"
    assert contention({"host_load1": 4.6}, 2, own=2) == "load 4.6 > 2 cores and the cell's 2 processes"


def test_a_one_process_cell_uses_a_device_when_its_training_grew_it_at_all():
    from bench.core.spec import devices_grown
    from bench.results.rows import distribution_check
    # A layer split of the built-in convnet: the last GPU holds a 2048 x 10 classifier, its
    # gradients and its inputs (about 0.7 MB). It is used; a GPU the cell never touched is not.
    assert devices_grown([50_000_000, 700_000 + 4096], [0, 4096]) == 2
    assert devices_grown([50_000_000, 4096], [0, 4096]) == 1
    # a GPU that received only the labels (2 KiB: a layer split moves them to its last GPU) is not used
    assert devices_grown([50_000_000, 4096 + 2048], [0, 4096]) == 1
    one = spec(n=2)
    one = type(one)(**{**one.__dict__, "n_procs": 1})
    used = rank(0, [0.1] * 4, devices_used=devices_grown([50_000_000, 704_096], [0, 4096]))
    inert = rank(0, [0.1] * 4, devices_used=devices_grown([50_000_000, 4096], [0, 4096]))
    assert distribution_check(one, [used], ["devices"]) is None
    assert distribution_check(one, [inert], ["devices"]) == "did not distribute: 1 of 2 planned GPUs held memory"


def test_every_mode_starts_its_row_in_one_place():
    from bench.core.spec import ServeCellSpec
    from bench.results.rows import base_row, start_row

    serve = ServeCellSpec(cell_id=3, workload="mlp", strategy="replicas", policy="rr", load="poisson@5/s",
                          scenario="levels", task="classify", offered_rps=5.0, batch_max=1, batch_wait_s=0.0,
                          slo_s=None, device="cpu", world_size=2, precision="fp32", params=None)
    row = start_row(serve, status="failed", reason="boom", wall_s=1.5, serve_policy="rr")
    assert row["mode"] == "serve" and (row["status"], row["reason"], row["cell_wall_s"]) == ("failed", "boom", 1.5)
    assert row["serve_policy"] == "rr"
    train = base_row(spec())
    assert train["mode"] == "train" and "status" not in train and train["world_size"] == spec().n_devices


def test_the_breakdown_gap_is_the_slowest_ranks_profiled_step_against_the_timed_median():
    """The timed median is each step's slowest rank; the gap compares that rank's profiled step,
    while the parts shown are the ranks' mean."""
    from bench.core.spec import RankMeasurement
    from bench.results.rows import _breakdown_columns

    bd = lambda step: {"compute_time_s": 0.08, "comm_time_s": 0.01, "exposed_comm_s": 0.01, "overlap_frac": 0.0,
                       "idle_frac": 0.1, "profiled_step_s": step}
    ranks = [RankMeasurement(rank=0, breakdown=bd(0.100)), RankMeasurement(rank=1, breakdown=bd(0.120))]
    row = {"step_time_median_s": 0.100}
    _breakdown_columns(row, ranks)
    assert row["profiled_step_s"] == pytest.approx(0.110) and row["breakdown_gap"] == pytest.approx(0.20)


def test_a_knob_the_strategy_did_not_apply_fails_the_row():
    """--ac full under a strategy that never ran a checkpointed forward, or --compile on where
    torch.compile built no graph: the row fails with the reason, never ok under the knob's name."""
    import dataclasses

    from bench.core.knobs import Training

    ranks = lambda **kw: [[rank(0, [0.1] * 4, **kw)]]
    ac = dataclasses.replace(spec(n=1), training=Training(ac="full"))
    row, _, _ = build_row(ac, ranks(checkpointed=0), wall_s=1.0)
    assert row["status"] == "failed" and row["reason"].startswith("ac=full, but no rank ran a forward")
    assert build_row(ac, ranks(checkpointed=2), wall_s=1.0)[0]["status"] == "ok"
    compiled = dataclasses.replace(spec(n=1), training=Training(compile="on"))
    row, _, _ = build_row(compiled, ranks(compiled_graphs=0), wall_s=1.0)
    assert row["status"] == "failed" and "built no graph on rank 0: the cell ran eager" in row["reason"]
    assert build_row(compiled, ranks(compiled_graphs=1), wall_s=1.0)[0]["status"] == "ok"


def test_a_compiled_cell_that_recompiled_in_its_timed_steps_fails_the_row():
    """Graphs built during the timed steps, or dynamo's recompile limit reached: the steps timed
    recompilation or eager code, so the row fails under compile=on with the rank and the hint."""
    import dataclasses

    from bench.core.knobs import Training

    compiled = dataclasses.replace(spec(n=1), training=Training(compile="on"))
    ranks = lambda **kw: [[rank(0, [0.1] * 4, compiled_graphs=2, **kw)]]
    row, _, _ = build_row(compiled, ranks(timed_graphs=5), wall_s=1.0)
    assert row["status"] == "failed" and "built 5 graphs during the timed steps on rank 0" in row["reason"]
    row, _, _ = build_row(compiled, ranks(timed_graphs=0, recompile_limit=True), wall_s=1.0)
    assert row["status"] == "failed" and "reached its recompile limit on rank 0" in row["reason"]
    assert build_row(compiled, ranks(timed_graphs=0), wall_s=1.0)[0]["status"] == "ok"
