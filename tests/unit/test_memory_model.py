"""The memory model's arithmetic (bench.core.memory), its activation probe on CPU (bench.plan.probe),
the planner's use of it (bench.plan.memory) and the row's memory columns (bench.results.rows)."""

import dataclasses

import pytest

from bench.core.config import build_config
from bench.core.memory import GIB, MARGIN, Footprint, Model, Probe, Terms, error, largest_batch, predict
from bench.plan import memory as plan_memory
from bench.plan.matrix import plan
from bench.plan.probe import Ask, probe_batches, run_probes

PROBE = Probe(batches=(2, 4), peaks=(3 * GIB, 4 * GIB), activation_peaks=(1 * GIB, 3 * GIB), context=0.5 * GIB)


def model(probe=PROBE, optimizer="adamw", device="cuda") -> Model:
    return Model(param_bytes=4 * GIB, trainable_bytes=4 * GIB, optimizer=optimizer, device=device, data=0.0,
                 probe=probe)


def test_the_activation_term_is_the_larger_of_the_two_probed_lines():
    # with no gradient at the start: 2 GiB + 0.5 GiB/sample; with every gradient held: -1 + 1/sample
    assert PROBE.activations(2) == pytest.approx(3 * GIB)
    assert PROBE.activations(16) == pytest.approx(15 * GIB)  # the activations' line overtakes
    assert PROBE.per_sample() == pytest.approx(1 * GIB)
    one = Probe(batches=(2,), peaks=(2 * GIB,))
    assert one.activations(6) == pytest.approx(6 * GIB)  # one point: through the origin


def test_a_cell_peaks_in_backward_or_at_the_optimizer_step_whichever_holds_more():
    fp = predict(model(), Terms(micro_batch=16))
    assert fp.at == "backward"
    assert fp.allocated == pytest.approx((4 + 8 + 15) * GIB)  # params, AdamW's two states, activations
    assert fp.components()["grads"] == 0 and fp.components()["activations"] == pytest.approx(15 * GIB)
    small = predict(model(Probe(batches=(1,), peaks=(0.1 * GIB,))), Terms(micro_batch=1))
    assert small.at == "optimizer step"
    assert small.allocated == pytest.approx((4 + 8 + 4) * GIB)  # every gradient at the fused step
    sharded = predict(model(), Terms(params=0.5, grads=0.5, state=0.5, micro_batch=16, buffers=GIB))
    assert sharded.allocated == pytest.approx((2 + 4 + 1 + 15) * GIB)


def test_fragmentation_context_and_nccl_are_cuda_terms_and_fit_needs_no_fragmentation():
    fp = predict(model(), Terms(micro_batch=16, communicators=1))
    assert fp.reserved > fp.allocated and fp.process > fp.reserved
    assert fp.required == pytest.approx(fp.allocated + fp.context + fp.comm)
    cpu = predict(model(device="cpu"), Terms(micro_batch=16))
    assert cpu.reserved is None and cpu.process is None and cpu.comm == 0
    assert cpu.temporaries == pytest.approx(4 * GIB)  # the multi-tensor Adam's intermediate on CPU


def test_the_largest_batch_that_fits_keeps_the_margin():
    terms = lambda b: Terms(micro_batch=b)  # noqa: E731
    fits = largest_batch(model(), terms, 80 * GIB)
    assert predict(model(), terms(fits)).required * (1 + MARGIN) <= 80 * GIB
    assert predict(model(), terms(fits + 1)).required * (1 + MARGIN) > 80 * GIB
    assert largest_batch(model(), terms, 10 * GIB) == 0
    assert largest_batch(model(probe=None), terms, 80 * GIB) is None


def test_without_a_probe_the_prediction_is_a_lower_bound_and_says_why():
    fp = predict(dataclasses.replace(model(probe=None), probe_note="the probe ran out of its 300 s"),
                 Terms(micro_batch=8))
    assert fp.lower_bound and fp.allocated == pytest.approx((4 + 8 + 4) * GIB)
    assert fp.columns()["mem_pred_how"] == "lower bound: activations not probed (the probe ran out of its 300 s)"


def test_error_is_none_where_nothing_was_measured():
    assert error(11.0, 10.0) == pytest.approx(0.1)
    assert error(1.0, None) is None and error(1.0, 0.0) is None and error(None, 1.0) is None


def test_probe_batches_are_a_quarter_and_a_half_of_the_largest():
    assert probe_batches([64, 16]) == (16, 32)
    assert probe_batches([4]) == (1, 2)
    assert probe_batches([1]) == (1,)


def test_the_cpu_probe_counts_live_tensors_and_checkpointing_holds_fewer():
    asks = [Ask(spec="gpt-tiny", dims={}, seed=0, precision="fp32", ac=ac, device="cpu", batches=(4, 8))
            for ac in ("none", "full")]
    asks.append(Ask(spec="no-such-workload", dims={}, seed=0, precision="fp32", ac="none", device="cpu",
                    batches=(1, 2)))
    got = run_probes(asks)
    none, full, bad = (got[a.key()] for a in asks)
    assert none.how == "traced" and none.peaks[1] > none.peaks[0] > 0
    assert full.activations(8) < none.activations(8)
    assert isinstance(bad, str) and "failed" in bad


def test_the_planner_skips_what_its_prediction_says_cannot_fit_and_names_the_batch_that_would(monkeypatch):
    cfg = build_config(toml=None, flags={"workloads": "gpt-small", "strategies": "single,ddp", "world_sizes": "1,2",
                                         "device": "cpu", "global_batch": 64}, gpus=0)
    cells, _, _ = plan(cfg, 0)
    fake = Probe(batches=(16, 32), peaks=(16 * GIB, 32 * GIB))  # 1 GiB a sample
    monkeypatch.setattr(plan_memory, "_probes", lambda runnable, terms, device, memory: {
        plan_memory._probe_key(p.spec, device): fake for p in runnable})
    out = plan_memory.predict_cells(cells, device="cpu", memory=48 * GIB, probe=True)
    by = {(p.spec.strategy, p.spec.n_devices): p for p in out}
    single = by[("single", 1)]
    assert single.reason.startswith("out of memory before it starts: predicted peak")
    assert f"at most {single.spec.memory.batch_fits} samples per device would fit (this cell: 64)" in single.reason
    assert 30 <= single.spec.memory.batch_fits < 48
    ddp = by[("ddp", 2)]  # 32 samples a rank, two ranks in 48 GiB: 24 GiB a rank
    assert ddp.reason is not None and ddp.spec.memory.micro_batch == 32
    roomy = plan_memory.predict_cells(cells, device="cpu", memory=1024 * GIB, probe=True)
    assert all(p.reason is None and isinstance(p.spec.memory, Footprint) for p in roomy)


def test_a_row_carries_the_prediction_beside_the_measurement():
    from bench.core.spec import RankMeasurement
    from bench.results.rows import memory_columns

    cfg = build_config(toml=None, flags={"workloads": "gpt-tiny", "strategies": "single", "device": "cpu"}, gpus=0)
    cells, _, _ = plan(cfg, 0)
    spec = dataclasses.replace(cells[0].spec, memory=predict(model(), Terms(micro_batch=16)))
    ranks = [RankMeasurement(rank=0, peak_mem=25 * GIB, peak_reserved=30 * GIB, held_params=4.0 * GIB)]
    cols = memory_columns(spec, ranks)
    assert cols["mem_pred_error"] == pytest.approx(27 / 25 - 1)
    assert cols["held_params_bytes"] == 4 * GIB and cols["mem_pred_at"] == "backward"
