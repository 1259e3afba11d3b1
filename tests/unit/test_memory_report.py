"""What the report and the recommendation say of memory: the predicted-against-measured figure and
table (reports.figures.memory_bars, reports.memory), the footprint read back from a row or from the
planner's reason (bench.decide.fits), the changes that would make a model fit nowhere fit, and a
one-device cell that ran out of memory while running (CUDA's OutOfMemoryError, a CPU rank killed by
SIGKILL) on hand-built cells."""

from __future__ import annotations

import json
from types import SimpleNamespace

import matplotlib.pyplot as plt
import pandas as pd
import pytest

from bench.core.memory import Footprint as CoreFootprint
from bench.decide.decision import ChangeKind, Ground, OomKind, decisions_from_json, decisions_to_json
from bench.decide.fits import footprint
from bench.decide.recommend import recommend
from bench.decide.rules import oom_kind, ran_out
from bench.plan.memory import fit_reason
from bench.results.store import RunWriter
from reports import build_report, figures, words
from reports.memory import memory_table

GIB = 2**30
CUDA_OOM = ("rank 0: OutOfMemoryError: CUDA out of memory. Tried to allocate 3.00 GiB. GPU 0 has a total capacity "
            "of 79.11 GiB of which 1.06 GiB is free.")
KILLED = "rank 0 exited with signal 9 (SIGKILL): no error line from it"


def predicted(strategy: str, ws: int, *, params: float, acts: float, status: str = "ok", reason: str = "",
              device: str = "cuda", capacity: float = 80 * GIB, fits: int | None = 4, **kw) -> dict:
    """A row with the memory model's columns: AdamW state twice the parameters, the peak at backward."""
    opt = 2 * params
    row = dict(workload="big", strategy=strategy, backend="nccl" if device == "cuda" else "gloo", device=device,
               world_size=ws, status=status, reason=reason, role="reference" if strategy == "single" else "",
               global_batch=16, scaling="strong", precision="bf16", ac="none", mem_pred_bytes=params + opt + acts,
               mem_pred_params_bytes=params, mem_pred_grads_bytes=params, mem_pred_optimizer_bytes=opt,
               mem_pred_activations_bytes=acts, mem_pred_buffers_bytes=0.0, mem_pred_data_bytes=0.0,
               mem_pred_at="backward", mem_pred_how="declared; activations measured", mem_batch_fits=fits,
               mem_capacity_bytes=capacity)
    if status == "ok":
        step = kw.pop("step", 0.2)
        row.update(step_time_median_s=step, step_time_ci_low_s=step * 0.99, step_time_ci_high_s=step * 1.01,
                   ci_basis="repeats (percentile)", stable=True, noise="", contended="",
                   throughput_samples_s=16 / step)
    row.update(kw)
    return row


# -- how a cell that ran out of memory shows in its row --------------------------------------------------


@pytest.mark.parametrize("status, reason, kind", [
    ("failed", CUDA_OOM, OomKind.RAN_OUT),
    ("failed", "rank 0: RuntimeError: DefaultCPUAllocator: can't allocate memory: you tried to allocate 8 GB",
     OomKind.RAN_OUT),
    ("failed", "rank 0: MemoryError", OomKind.RAN_OUT),
    ("failed", KILLED, OomKind.KILLED),
    ("failed", "torchrun exited with signal 9 (SIGKILL)", OomKind.KILLED),
    ("skipped", "out of memory before it starts: predicted peak 90.0 GiB (params 30.0) > 79.1 GiB on one GPU",
     OomKind.PLANNED),
    ("timeout", "no result within cell_timeout_s=600s; rank 0 exited with signal 9 (SIGKILL)", None),  # our kill
    ("failed", "rank 1 exited with exit code 1: ValueError: bad option", None),
])
def test_how_a_cell_ran_out_of_memory_is_read_from_its_reason(status, reason, kind):
    assert oom_kind(status, reason) == kind
    assert bool(ran_out(pd.DataFrame([dict(status=status, reason=reason)])).iloc[0]) is (kind is not None)


# -- a model no single device holds: the fastest that fits, with its headroom -----------------------------


def test_a_cpu_rank_killed_out_of_memory_says_the_model_does_not_fit_one_device():
    """The new user's case: their own model's one-device cell on CPU killed by the kernel's OOM
    killer, fsdp x2 ran with a short step. Not launch-bound (the reference never ran): the model does
    not fit one device, with the prediction's headroom (no allocator peak on CPU)."""
    rows = [predicted("single", 1, params=1e9, acts=2e9, status="failed", reason=KILLED, device="cpu",
                      capacity=8e9, cell_id=0),
            predicted("fsdp", 2, params=0.5e9, acts=1.5e9, device="cpu", capacity=4e9, step=0.004, cell_id=1)]
    (p,) = recommend(pd.DataFrame(rows))
    assert not p.launch_bound and p.use == "fsdp" and p.fits_one_device is False
    assert p.fit.oom == OomKind.KILLED and p.fit.predicted
    assert p.fit.peak_bytes == pytest.approx(3e9) and p.headroom == pytest.approx(0.25)
    real, toys = words.split([p])
    screen = "\n".join(line for line, _ in words.screen(real, toys))
    assert "launch-bound" not in screen
    assert "does not fit one device (single: killed by SIGKILL, on Linux the kernel's out-of-memory killer); " \
           "predicted peak 2.8 of 3.7 GiB, 25% headroom" in screen


def test_a_cuda_reference_out_of_memory_while_running_keeps_the_measured_peak():
    rows = [predicted("single", 1, params=30 * GIB, acts=30 * GIB, status="failed", reason=CUDA_OOM, cell_id=0),
            predicted("fsdp", 2, params=15 * GIB, acts=15 * GIB, peak_mem_bytes=60 * GIB, step=0.004, cell_id=1)]
    (p,) = recommend(pd.DataFrame(rows))
    assert p.fit.oom == OomKind.RAN_OUT and not p.fit.predicted and not p.launch_bound
    assert p.fit.device_bytes == pytest.approx(79.11 * GIB)  # from the error's own words
    assert words.fit_text(p).startswith("does not fit one device (single: out of memory); peak 60.0 of 79.1 GiB")


def test_a_workload_whose_reference_ran_is_still_judged_launch_bound():
    rows = [predicted("single", 1, params=1e6, acts=1e6, step=0.002, cell_id=0),
            predicted("ddp", 2, params=1e6, acts=1e6, step=0.0015, cell_id=1)]
    (p,) = recommend(pd.DataFrame(rows))
    assert p.launch_bound


# -- a model that fits nowhere: the cheapest change that would make it fit -----------------------------------


def nowhere_rows(**kw) -> list[dict]:
    """One device predicted not to fit (skipped), ddp x2 and fsdp x2 out of memory while running."""
    return [predicted("single", 1, params=30 * GIB, acts=40 * GIB, status="skipped", fits=0, cell_id=0,
                      reason="out of memory before it starts: predicted peak 130.0 GiB (...) > 80.0 GiB on one GPU"),
            predicted("ddp", 2, params=30 * GIB, acts=20 * GIB, status="failed", reason=CUDA_OOM, fits=0, cell_id=1),
            predicted("fsdp", 2, params=15 * GIB, acts=40 * GIB, status="failed", reason=CUDA_OOM, fits=2, cell_id=2,
                      **kw)]


def test_a_model_that_fits_nowhere_gets_each_change_with_its_predicted_peak():
    (p,) = recommend(pd.DataFrame(nowhere_rows()))
    assert p.ground == Ground.FITS_NOWHERE and p.use is None and not p.launch_bound
    f = p.fit
    assert f.nearest == "fsdp x2" and f.peak_bytes == pytest.approx(85 * GIB) and not f.missed
    ch = {c.kind: c for c in f.changes}
    # fsdp x2 already shards its state: no sharded optimizer; a micro-batch of 2 (now 8) keeps a quarter of the
    # activations; fsdp x4 cuts the model and state in half again and the activations with the micro-batch
    assert set(ch) == {ChangeKind.SMALLER_BATCH, ChangeKind.MORE_DEVICES, ChangeKind.CHECKPOINT}
    # at 2 samples the optimizer step's peak is the larger: 15 + 30 GiB held, 15 GiB of gradients
    assert ch[ChangeKind.SMALLER_BATCH].peak_bytes == pytest.approx(60 * GIB) and ch[ChangeKind.SMALLER_BATCH].fits
    assert ch[ChangeKind.MORE_DEVICES].world_size == 4
    assert ch[ChangeKind.MORE_DEVICES].peak_bytes == pytest.approx(22.5 * GIB + 20 * GIB)
    assert ch[ChangeKind.CHECKPOINT].peak_bytes is None  # no cell at --ac full: its share, no number
    assert ch[ChangeKind.CHECKPOINT].activations == pytest.approx(40 / 85)
    assert [c.fits for c in f.changes] == [True, True, None]  # what fits first, in the order of their cost
    line = " ".join(words.lines(p))
    assert line.startswith("big, nccl x2: no decision: it fits nowhere in the matrix: every cell ran out of memory "
                           "(one device: single, out of memory); nearest: fsdp x2, predicted peak 85.0 of 80.0 GiB")
    assert "next: cheapest change that fits: a micro-batch of 2 per device (now 8): predicted peak 60.0 GiB, fits; " \
           "also the model cut over 4 devices (fsdp x4): predicted peak 42.5 GiB, fits; activation checkpointing " \
           "(--ac full): 47% of the peak is activations, which it would remove most of" in line
    assert words.excluded_text(p) == "single x1: out of memory; ddp x2: out of memory; fsdp x2: out of memory"
    assert decisions_from_json(json.loads(json.dumps(decisions_to_json([p])))) == [p]


def test_a_whole_copy_on_each_device_gets_a_sharded_optimizer_first():
    rows = [predicted("ddp", 2, params=20 * GIB, acts=40 * GIB, status="failed", reason=CUDA_OOM, fits=None)]
    (p,) = recommend(pd.DataFrame(rows))
    assert [c.kind for c in p.fit.changes] == [ChangeKind.MORE_DEVICES, ChangeKind.SHARD_OPTIMIZER,
                                               ChangeKind.CHECKPOINT]  # what fits first
    more, shard, _ = p.fit.changes
    assert (shard.strategy, shard.world_size, shard.fits) == ("ddp-zero1", 2, False)
    assert shard.peak_bytes == pytest.approx(20 * GIB + 20 * GIB + 40 * GIB)  # the state halved: 80 GiB
    assert (more.strategy, more.world_size, more.fits) == ("fsdp", 2, True)  # over the same two devices
    assert more.peak_bytes == pytest.approx(30 * GIB + 40 * GIB)


def test_checkpointing_uses_the_runs_own_prediction_at_ac_full():
    rows = nowhere_rows() + [predicted("fsdp", 2, params=15 * GIB, acts=10 * GIB, status="failed", reason=CUDA_OOM,
                                       cell_id=7, ac="full", mem_pred_bytes=200 * GIB)]
    (p,) = recommend(pd.DataFrame(rows))
    ck = next(c for c in p.fit.changes if c.kind == ChangeKind.CHECKPOINT)
    assert (ck.cell, ck.peak_bytes, ck.fits) == (7, 200 * GIB, False)
    assert words.change_text(ck) == "activation checkpointing (--ac full, as cell 7 of this run): predicted peak " \
                                    "200.0 GiB, still too large"


def test_a_cell_predicted_to_fit_that_ran_out_says_the_prediction_is_low():
    (p,) = recommend(pd.DataFrame(nowhere_rows(mem_pred_activations_bytes=10 * GIB, mem_pred_bytes=55 * GIB)))
    assert p.fit.missed and "the memory model under-predicts it, so the peaks below are low" in words.because_text(p)


def test_the_planners_reason_is_read_back_where_the_row_has_no_prediction():
    """A skipped row carries the planner's words only: its peak, parts, capacity and batch are read from them."""
    fp = CoreFootprint(params=10 * GIB, grads=10 * GIB, optimizer=20 * GIB, activations=30 * GIB, buffers=0.0,
                       data=0.0, micro_batch=8, batch_fits=3, capacity=40 * GIB)
    reason = fit_reason(SimpleNamespace(device="cuda", training=SimpleNamespace(ac="none")), fp, 40 * GIB)
    back = footprint(pd.Series(dict(status="skipped", reason=reason, world_size=1, global_batch=8)))
    assert back.allocated == pytest.approx(60 * GIB) and back.activations == pytest.approx(30 * GIB)
    assert (back.params, back.optimizer, back.capacity) == (10 * GIB, 20 * GIB, 40 * GIB)
    assert (back.batch_fits, back.micro_batch, back.at) == (3, 8, "backward")
    rows = pd.DataFrame([dict(workload="big", strategy="single", backend="nccl", device="cuda", world_size=1,
                              status="skipped", reason=reason, role="reference", global_batch=8)])
    (p,) = recommend(rows)
    assert p.ground == Ground.FITS_NOWHERE and p.fit.peak_bytes == pytest.approx(60 * GIB)
    assert {c.kind for c in p.fit.changes} >= {ChangeKind.SHARD_OPTIMIZER, ChangeKind.SMALLER_BATCH}


def test_no_prediction_anywhere_says_so():
    rows = pd.DataFrame([dict(workload="big", strategy="single", backend="nccl", device="cuda", world_size=1,
                              status="failed", reason=CUDA_OOM, role="reference", global_batch=8)])
    (p,) = recommend(rows)
    assert p.fit.peak_bytes is None and p.fit.changes == ()
    assert words.because_text(p).endswith("no cell's row holds a prediction") and words.next_text(p) == ""


# -- the figure and the table --------------------------------------------------------------------------------


def gpu_cells() -> pd.DataFrame:
    return pd.DataFrame(gpu_rows())


def gpu_rows() -> list[dict]:
    return [predicted("single", 1, params=10 * GIB, acts=20 * GIB, peak_mem_bytes=45 * GIB,
                      peak_reserved_bytes=48 * GIB, nvml_process_bytes=50 * GIB, mem_pred_error=50 / 45 - 1,
                      mem_pred_reserved_error=0.02, cell_id=0),
            predicted("fsdp", 2, params=5 * GIB, acts=20 * GIB, peak_mem_bytes=36 * GIB, mem_pred_error=35 / 36 - 1,
                      cell_id=1),
            predicted("ddp", 2, params=60 * GIB, acts=20 * GIB, status="failed", reason=CUDA_OOM, cell_id=2)]


def test_the_memory_figure_stacks_the_prediction_and_marks_what_was_measured():
    ax = figures.memory_bars(gpu_cells(), "big")
    labels = {t.get_text() for t in ax.get_legend().get_texts()}
    assert {"predicted params", "predicted optimizer", "predicted activations", "measured allocated peak",
            "measured reserved peak", "NVML process memory", "capacity of a rank"} <= labels
    assert [t.get_text() for t in ax.get_yticklabels()] == ["single nccl x1", "fsdp nccl x2"]  # ok cells only
    notes = [t.get_text() for t in ax.texts]
    assert notes == ["pred +11%", "pred -3%"]
    stacked = [p for p in ax.patches if abs(p.get_height() - 0.55) < 1e-9]
    assert max(p.get_x() + p.get_width() for p in stacked) == pytest.approx(50)  # GiB: the single's predicted peak
    assert ax.get_xlabel() == "GiB on the cell's fullest device"
    plt.close(ax.figure)


def test_on_cpu_the_figure_draws_what_was_counted_on_the_rank():
    cells = pd.DataFrame([predicted("single", 1, params=4e6, acts=8e6, device="cpu", capacity=2e10,
                                    held_params_bytes=4e6, held_grads_bytes=4e6, held_optimizer_bytes=8e6)])
    ax = figures.memory_bars(cells, "big")
    assert "counted on the rank (params, grads, state)" in {t.get_text() for t in ax.get_legend().get_texts()}
    assert [t.get_text() for t in ax.texts] == ["held +0% of pred"]
    assert ax.get_xlabel() == "MiB on the cell's fullest device (a rank's capacity, 18.6 GiB, is off the axis)"
    plt.close(ax.figure)


def test_the_memory_table_lists_every_cell_with_a_prediction():
    t = memory_table(gpu_cells(), "big")
    assert [r[0] for r in t["rows"]] == ["single nccl x1", "ddp nccl x2", "fsdp nccl x2"]
    single = dict(zip(t["head"], t["rows"][0]))
    assert (single["predicted GiB"], single["measured GiB"], single["error"], single["fits b/dev"]) == \
        ("50", "45", "+11%", "4")
    assert dict(zip(t["head"], t["rows"][1]))["status"] == "failed"


def test_runs_without_the_memory_model_draw_no_memory_section(tmp_path):
    old = gpu_cells().drop(columns=[c for c in gpu_cells().columns if c.startswith("mem_")])
    assert figures.memory_cells(old, "big").empty and memory_table(old, "big") is None


def test_the_report_embeds_the_memory_figure_and_table(tmp_path):
    w = RunWriter(tmp_path / "r")
    for row in gpu_rows():
        w.add({**row, "mode": "train"}, [])
    (tmp_path / "r" / "meta.json").write_text(json.dumps({"host": "h", "torch": "x", "run_id": "r"}))
    html = build_report(tmp_path / "r").read_text()
    assert "big-memory" in html and "<table class=\"memory\">" in html
    assert "Memory: the memory model" in html and words.memory_caption(False).endswith("10% margin.")
