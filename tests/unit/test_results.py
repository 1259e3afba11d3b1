import pandas as pd
import pytest

from bench.core.errors import UserError
from bench.results.derived import derive
from bench.results.run import load_run
from bench.results.store import CELL_COLUMNS, STEP_COLUMNS, RunWriter, frame


def cell(cid, strategy, ws, tput, precision="fp32"):
    return dict(cell_id=cid, workload="w", strategy=strategy, backend="gloo", device="cpu", world_size=ws,
                status="ok", precision=precision, throughput_samples_s=tput,
                role="reference" if strategy == "single" else "")


def steps(cid, losses, ranks=1):
    return [dict(cell_id=cid, rank=r, step=s, phase="timed", step_time_s=0.1, loss=loss, loss_weight=1 / ranks)
            for s, loss in enumerate(losses) for r in range(ranks)]


def test_parity_and_scaling_against_the_single_device_reference():
    cells = frame([cell(0, "single", 1, 100.0), cell(1, "ddp", 2, 150.0), cell(2, "bad", 2, 190.0)], CELL_COLUMNS)
    st = frame(steps(0, [2.0, 1.9, 1.8]) + steps(1, [2.0, 1.9, 1.8000001], ranks=2)
               + steps(2, [2.0, 1.95, 1.9], ranks=2), STEP_COLUMNS)
    out = derive(cells, st).set_index("strategy")
    assert out.loc["ddp", "scaling_efficiency"] == pytest.approx(0.75)
    assert out.loc["ddp", "parity_ok"] and out.loc["ddp", "parity_rel_err"] < 1e-6
    assert not out.loc["bad", "parity_ok"]
    assert out.loc["bad", "parity_rel_err"] == pytest.approx(0.1 / 1.8)
    assert out.loc["single", "parity_rel_err"] == 0


def test_an_efficiency_above_one_names_its_cause():
    rows = [cell(0, "single", 1, 100.0, "bf16"), cell(1, "fsdp", 2, 218.0, "bf16"), cell(2, "ddp", 2, 230.0, "bf16"),
            cell(3, "fsdp-noreshard", 2, 180.0, "bf16")]
    rows[1]["fsdp_param_dtype"], rows[3]["fsdp_param_dtype"] = "bf16", "bf16"
    out = derive(frame(rows, CELL_COLUMNS), frame([], STEP_COLUMNS)).set_index("strategy")
    assert out.loc["fsdp", "scaling_efficiency"] == pytest.approx(1.09)
    assert "bf16 (MixedPrecisionPolicy)" in out.loc["fsdp", "scaling_note"]
    assert "not physical" in out.loc["ddp", "scaling_note"]
    assert pd.isna(out.loc["fsdp-noreshard", "scaling_note"])  # 0.9: a plain number
    assert pd.isna(out.loc["single", "scaling_note"])


def test_bf16_tolerance_is_looser():
    cells = frame([cell(0, "single", 1, 1.0, "bf16"), cell(1, "ddp", 2, 1.0, "bf16")], CELL_COLUMNS)
    st = frame(steps(0, [2.0]) + steps(1, [2.02]), STEP_COLUMNS)
    assert derive(cells, st).set_index("strategy").loc["ddp", "parity_ok"]


def test_a_parity_failure_says_its_step_its_tolerance_and_batch_norm():
    """The answer to a failed parity names the largest difference, the step, the tolerance and how to
    set it; a BatchNorm model split over ranks is named as a difference in semantics; a tolerance
    given for the cell (--parity-tol, or the workload's) is the one it is judged by."""
    from bench.results.derived import parity_failure

    rows = [cell(0, "single", 1, 100.0), cell(1, "ddp", 2, 150.0), cell(2, "fsdp", 2, 150.0)]
    for r in rows:
        r["batch_norm"] = "BatchNorm2d"
    rows[2]["parity_tol_set"] = 0.1
    st = frame(steps(0, [2.0, 1.9, 1.8]) + steps(1, [2.0, 1.9, 1.9], ranks=2) + steps(2, [2.0, 1.9, 1.9], ranks=2),
               STEP_COLUMNS)
    out = derive(frame(rows, CELL_COLUMNS), st).set_index("strategy")
    assert not out.loc["ddp", "parity_ok"] and out.loc["ddp", "parity_step"] == 2
    assert out.loc["fsdp", "parity_ok"] and out.loc["fsdp", "parity_tol"] == 0.1  # 0.056 within the 0.1 given
    why = parity_failure(out.loc["ddp"].to_dict() | {"world_size": 2})
    assert why.startswith("parity with one device failed: rel err 5.6e-02 at step 2 > tolerance 1e-05 "
                          "(--parity-tol or the workload's parity_tol sets it); the model has BatchNorm2d: each rank "
                          "normalises over its share of the batch"), why


def test_the_tolerance_follows_the_references_own_rounding_up_to_a_cap():
    """A reference that measured its rounding (parity_rounding) sets the tolerance of the cells
    compared with it to ROUNDING_FACTOR times that, never past ROUNDING_CAP, never below the
    precision's default (also under AdamW, whose fixed 1e-3 is for references without it); a
    tolerance given for a cell still wins."""
    from bench.results.derived import ROUNDING_CAP, ROUNDING_FACTOR

    def judged(rounding, given=None, err=2e-5):
        rows = [cell(0, "single", 1, 100.0), cell(1, "ddp", 2, 150.0)]
        rows[0]["parity_rounding"], rows[1]["parity_tol_set"] = rounding, given
        st = frame(steps(0, [2.0, 1.9]) + steps(1, [2.0, 1.9 * (1 + err)], ranks=2), STEP_COLUMNS)
        return derive(frame(rows, CELL_COLUMNS), st).set_index("strategy").loc["ddp"]

    assert not judged(None)["parity_ok"] and judged(None)["parity_tol"] == 1e-5  # 2e-5 past the fp32 default
    wide = judged(2e-7)
    assert wide["parity_ok"] and wide["parity_tol"] == pytest.approx(ROUNDING_FACTOR * 2e-7)
    assert judged(1e-9)["parity_tol"] == 1e-5  # a tiny rounding keeps the default
    capped = judged(1.0, err=5e-3)
    assert capped["parity_tol"] == ROUNDING_CAP and not capped["parity_ok"]
    assert judged(2e-7, given=1e-6)["parity_tol"] == 1e-6 and not judged(2e-7, given=1e-6)["parity_ok"]


def test_a_batch_is_reversed_along_its_samples_or_not_at_all():
    import torch

    from bench.train.rounding import reversed_batch

    x, y = torch.arange(6.0).reshape(3, 2), torch.tensor([0, 1, 2])
    fx, fy = reversed_batch((x, y))
    assert torch.equal(fx, x.flip(0)) and torch.equal(fy, torch.tensor([2, 1, 0]))
    d = reversed_batch({"input_ids": x, "labels": y, "scale": torch.tensor(2.0)})
    assert torch.equal(d["labels"], y.flip(0)) and d["scale"] == 2.0
    assert reversed_batch((x, torch.zeros(4))) is None  # no shared sample dimension
    assert reversed_batch(torch.zeros(1, 5)) is None  # one sample: nothing to reorder
    assert reversed_batch("text") is None


def test_writer_keeps_every_finished_cell_on_disk(tmp_path):
    w = RunWriter(tmp_path / "run1")
    w.add(cell(0, "single", 1, 10.0), steps(0, [1.0, 0.9]))
    first = pd.read_parquet(tmp_path / "run1" / "cells.parquet")  # a folder of parts reads as one table
    assert len(first) == 1
    w.add(dict(cell_id=1, workload="w", strategy="ddp", backend="gloo", device="cpu", world_size=2,
               status="failed", reason="boom"))
    cells, st, _ = load_run(tmp_path / "run1")
    assert list(cells["status"]) == ["ok", "failed"] and len(st) == 2
    assert list(cells.columns[: len(CELL_COLUMNS)]) == list(CELL_COLUMNS)
    assert not list((tmp_path / "run1").glob("*/.*tmp"))
    # append-only: the first part is untouched by the second cell
    parts = sorted((tmp_path / "run1" / "cells.parquet").iterdir())
    assert len(parts) == 2 and pd.read_parquet(parts[0])["cell_id"].tolist() == [0]


def test_writer_refuses_a_column_the_registry_does_not_know(tmp_path):
    w = RunWriter(tmp_path / "run1")
    with pytest.raises(ValueError, match="not in its schema"):
        w.add(dict(cell(0, "single", 1, 1.0), colour="red"))


def test_old_single_file_runs_still_load(tmp_path):
    d = tmp_path / "old"
    d.mkdir()
    frame([cell(0, "single", 1, 10.0)], CELL_COLUMNS).drop(columns=["role"]).to_parquet(d / "cells.parquet")
    frame(steps(0, [1.0]), STEP_COLUMNS).to_parquet(d / "steps.parquet")
    cells, st, meta = load_run(d)
    assert cells.loc[0, "scaling_efficiency"] == 1.0 and cells.loc[0, "parity_ok"] and meta == {}


def test_load_run_names_what_is_wrong(tmp_path):
    with pytest.raises(UserError, match="not a parbench run folder"):
        load_run(tmp_path)
    pd.DataFrame({"workload": ["w"]}).to_parquet(tmp_path / "cells.parquet")
    with pytest.raises(UserError, match="lacks column"):
        load_run(tmp_path)


def test_a_run_of_a_newer_schema_loads_with_a_warning(tmp_path, caplog):
    import json

    from bench import SCHEMA_VERSION

    w = RunWriter(tmp_path / "run1")
    w.add(cell(0, "single", 1, 10.0), steps(0, [1.0, 0.9]))
    (tmp_path / "run1" / "meta.json").write_text(json.dumps({"schema_version": SCHEMA_VERSION + 1}))
    with caplog.at_level("WARNING", logger="parbench"):
        cells, _, _ = load_run(tmp_path / "run1")
    assert len(cells) == 1
    assert f"newer parbench (schema {SCHEMA_VERSION + 1}; this one reads {SCHEMA_VERSION})" in caplog.text
    caplog.clear()
    (tmp_path / "run1" / "meta.json").write_text(json.dumps({"schema_version": SCHEMA_VERSION}))
    load_run(tmp_path / "run1")
    assert "newer parbench" not in caplog.text
