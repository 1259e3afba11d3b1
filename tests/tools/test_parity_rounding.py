"""tools/parity_rounding.py: each cell's parity error set against its own reference's rounding."""

import pandas as pd
import pytest

from tools import parity_rounding


def cell(workload, strategy, role, err, rounding, optimizer="sgd", ws=2):
    return {"workload": workload, "optimizer": optimizer, "strategy": strategy, "world_size": ws, "role": role,
            "parity_rel_err": err, "parity_rounding": rounding, "parity_tol": 1e-4,
            "parity_ok": err is None or err < 1e-4}


def test_each_cell_is_divided_by_the_rounding_of_its_own_workload_and_optimizer(tmp_path, monkeypatch):
    cells = pd.DataFrame([
        cell("mlp", "single", "reference", None, 2e-7, ws=1),
        cell("mlp", "single", "reference", None, 5e-7, optimizer="adamw", ws=1),
        cell("cnn", "single", "reference", None, 1e-6, ws=1),
        cell("mlp", "ddp", "", 4e-7, None),
        cell("mlp", "fsdp", "", 2e-7, None),
        cell("mlp", "ddp", "", 5e-6, None, optimizer="adamw"),
        cell("cnn", "ddp", "", 3e-3, None),
        cell("cnn", "tensor", "", None, None),  # no parity (failed cell): no row
    ])
    seen = {}
    monkeypatch.setattr(parity_rounding.launcher, "run", lambda cfg, gpus: seen.setdefault("cfg", cfg) and "RUN")
    monkeypatch.setattr(parity_rounding, "load_run", {"RUN": (cells, {}, None)}.__getitem__)
    t = parity_rounding.table(parity_rounding.measure(str(tmp_path), "mlp,cnn", "single,ddp", "2", "sgd,adamw"))
    assert seen["cfg"].training.knobs["optimizer"] == ["sgd", "adamw"] and seen["cfg"].matrix.world_sizes == [2]
    assert list(zip(t["workload"], t["optimizer"], t["strategy"])) == [
        ("cnn", "sgd", "ddp"), ("mlp", "adamw", "ddp"), ("mlp", "sgd", "fsdp"), ("mlp", "sgd", "ddp")]
    assert t["ratio"].tolist() == pytest.approx([3e3, 10.0, 1.0, 2.0])
    assert t["parity_rounding"].tolist() == [1e-6, 5e-7, 2e-7, 2e-7]


def test_a_measured_run_is_judged_again_without_measuring(tmp_path, monkeypatch, capsys):
    cells = pd.DataFrame([cell("mlp", "single", "reference", None, 2e-7, ws=1), cell("mlp", "ddp", "", 4e-7, None)])
    monkeypatch.setattr(parity_rounding.launcher, "run", lambda cfg, gpus: pytest.fail("measured"))
    monkeypatch.setattr(parity_rounding, "load_run", {"RUN": (cells, {}, None)}.__getitem__)
    out = tmp_path / "t.csv"
    assert parity_rounding.main(["--run", "RUN", "--csv", str(out)]) == 0
    assert pd.read_csv(out)["ratio"].tolist() == [2.0]
    with pytest.raises(SystemExit):
        parity_rounding.main([])
