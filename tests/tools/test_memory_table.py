"""tools/memory_table.py: predicted against measured memory, one row a cell, from run folders."""

import pandas as pd
import pytest

from bench.core.memory import GIB
from tools import memory_table


def test_the_table_puts_the_prediction_beside_the_measurement(tmp_path, monkeypatch, capsys):
    cells = pd.DataFrame({"workload": ["gpt-200m", "gpt-200m"], "strategy": ["single", "single"],
                          "world_size": [1, 1], "global_batch": [8, 32], "optimizer": ["sgd", "adamw"],
                          "ac": ["none", "full"], "compile": ["off", "off"], "status": ["ok", "skipped"],
                          "params": [236_000_000, 236_000_000], "mem_pred_bytes": [7.5 * GIB, 200 * GIB],
                          "peak_mem_bytes": [7.6 * GIB, None], "mem_pred_error": [7.5 / 7.6 - 1, None],
                          "reason": [None, "out of memory before it starts: predicted peak 200.0 GiB"]})
    monkeypatch.setattr(memory_table, "load_run", lambda folder: (cells, None, None))
    out = tmp_path / "t.csv"
    assert memory_table.main(["RUN", "--csv", str(out)]) == 0
    t = pd.read_csv(out)
    assert list(t["pred_gib"]) == [7.5, 200.0]
    assert t["err"][0] == pytest.approx(7.5 / 7.6 - 1, abs=1e-4) and pd.isna(t["err"][1])
    assert t["params_b"][0] == 0.236 and t["reason"][1].startswith("out of memory")
    assert "gpt-200m" in capsys.readouterr().out
