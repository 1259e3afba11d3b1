"""tools/baselines/order_effect.py: predecessors read from the recorded order, the separation verdict
with its exact chance, the drift beside it."""

from __future__ import annotations

import pandas as pd
import pytest

from tools.baselines import order_effect


def _run(monkeypatch, order: list[tuple[str, int, float]], ws: int = 2):
    """A fake run: cells ddp (1), fsdp (2), 1f1b (3) in one group; ``order`` = (strategy, repeat,
    median s) in the order they ran, 4 timed steps each, 1 s apart."""
    ids = {"ddp": 1, "fsdp": 2, "1f1b": 3}
    cells = pd.DataFrame([{"cell_id": i, "strategy": s, "world_size": ws, "backend": "nccl", "nproc": ws, "nnodes": 1,
                           "workload": "gpt-200m"} for s, i in ids.items()])
    rows, t = [], 1000.0
    for strat, rep, med in order:
        for k in range(4):
            for rank in (0, 1):
                rows.append({"cell_id": ids[strat], "repeat": rep, "rank": rank, "step": k, "phase": "timed",
                             "step_time_s": med, "t_unix": t + k * 0.1})
        rows.append({"cell_id": ids[strat], "repeat": rep, "rank": 0, "step": 0, "phase": "warmup",
                     "step_time_s": 9.0, "t_unix": t - 0.5})  # warm-up steps are not the median
        t += 1.0
    monkeypatch.setattr(order_effect, "load_run", lambda d: (cells, pd.DataFrame(rows), {}))
    return order_effect.repeat_table("x")


def test_predecessors_follow_the_recorded_order_across_rounds(monkeypatch):
    per = _run(monkeypatch, [("ddp", 0, .1), ("1f1b", 0, .2), ("fsdp", 0, .3),
                             ("fsdp", 1, .3), ("ddp", 1, .1), ("1f1b", 1, .2)])
    got = list(zip(per["label"].str.split().str[0], per["repeat"], per["after"], per["after_profiled"]))
    assert got == [("ddp", 0, order_effect.START, False), ("1f1b", 0, "ddp x2", True), ("fsdp", 0, "1f1b x2", True),
                   ("fsdp", 1, "fsdp x2", True), ("ddp", 1, "fsdp x2", False), ("1f1b", 1, "ddp x2", False)]
    assert set(per["group"]) == {"nccl, 2 proc"} and per["label"].iloc[0] == "ddp x2"
    assert per["median_s"].tolist() == pytest.approx([.1, .2, .3, .3, .1, .2])  # warm-up steps left out
    assert (per["steps"] == 4).all()


def test_a_slow_predecessor_is_named_only_when_its_separation_is_unlikely_by_chance(monkeypatch):
    # 1f1b after fsdp is slow (0.23) in 3 repeats, after anything else 0.19-0.20 in 5: p = 1 / C(8, 3)
    order = []
    for r, first in enumerate(["fsdp", "ddp", "fsdp", "ddp", "fsdp", "ddp", "ddp", "ddp"]):
        slow = first == "fsdp"
        order += [(first, r, .1), ("1f1b", r, .23 if slow else .19 + .002 * r),
                  ("ddp" if first == "fsdp" else "fsdp", r, .1)]
    per = _run(monkeypatch, order)
    rows = order_effect.summarize(per, "1f1b")
    v = rows[-1]["verdict"]
    # 3 among 8 in two groups: either group top or bottom, 2 / C(8, 3) = 0.036
    assert v.startswith("slower after fsdp x2") and "permutation p = 0.03" in v, v
    # the same separation from 1 repeat among 5 is reported as chance (2 / 5)
    v = order_effect.verdict({"a": [2.0], "b": [1.0, 1.1, 1.2, 1.3]})
    assert v.startswith("slower after a, but some group separates that way by chance with p = 0.4"), v
    assert order_effect.verdict({"a": [1.0, 1.2], "b": [1.1, 1.3]}).startswith("no predecessor apart")
    assert order_effect.verdict({"a": [1.0]}).startswith("one predecessor only")


def test_the_chance_counts_every_group_and_both_directions():
    from math import comb

    # two groups of 3 and 5: the only separations are 3 on top or at the bottom: 2 / C(8, 3)
    assert order_effect.chance([3, 5]) == pytest.approx(2 / comb(8, 3), abs=0.005)
    # three groups: more ways to separate than one group's 1 / C(N, k) (about 13%)
    assert 0.12 < order_effect.chance([2, 3, 3]) < 0.15
    assert order_effect.chance([1, 4]) == pytest.approx(0.4, abs=0.01)


def test_drift_is_reported_beside_the_verdict(monkeypatch):
    per = _run(monkeypatch, [(s, r, .1 * (1 + .01 * r)) for r in range(4) for s in ("ddp",)])
    (row,) = [r for r in order_effect.summarize(per) if "verdict" in r]
    assert row["drift"] == pytest.approx(0.03) and row["drift_rho"] == pytest.approx(1.0)


def test_not_a_run_folder_is_a_one_line_error(tmp_path, capsys):
    assert order_effect.main([str(tmp_path)]) == 2
    assert "not a run folder" in capsys.readouterr().err
