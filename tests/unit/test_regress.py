import pytest

from bench import UserError
from bench.regress import compare, failed, parse_threshold
from bench.results import CELL_COLUMNS, frame


def cells(tputs, statuses=None):
    rows = []
    for i, (strategy, t) in enumerate(tputs.items()):
        rows.append(dict(cell_id=i, workload="w", strategy=strategy, backend="gloo", device="cpu", world_size=2,
                         status=(statuses or {}).get(strategy, "ok"), throughput_samples_s=t, global_batch=8,
                         step_time_ci_low_s=8 / t * 0.99, step_time_ci_high_s=8 / t * 1.01))
    return frame(rows, CELL_COLUMNS)


def test_verdicts():
    base = cells({"ddp": 100.0, "allreduce": 100.0, "single": 100.0, "gone": 5.0, "fsdp": 10.0})
    cur = cells({"ddp": 90.0, "allreduce": 97.0, "single": 120.0, "fsdp": 10.0, "new": 1.0},
                statuses={"fsdp": "failed"})
    t = compare(base, cur, 0.05).set_index("strategy")
    assert t.loc["ddp", "verdict"] == "regression" and t.loc["ddp", "change"] == pytest.approx(-0.1)
    assert t.loc["allreduce", "verdict"] == "same"
    assert t.loc["single", "verdict"] == "improvement"
    assert t.loc["gone", "verdict"] == "missing" and t.loc["new", "verdict"] == "new"
    assert t.loc["fsdp", "verdict"] == "broken"
    assert not t.loc["ddp", "ci_overlap"]
    assert failed(compare(base, cur, 0.05))
    assert not failed(compare(base, cells({"ddp": 96.0, "allreduce": 100.0, "single": 100.0, "fsdp": 10.0}), 0.05))


@pytest.mark.parametrize("text, frac", [("5%", 0.05), ("5", 0.05), ("0.05", 0.05), ("12.5%", 0.125)])
def test_threshold_parsing(text, frac):
    assert parse_threshold(text) == pytest.approx(frac)


def test_bad_threshold():
    with pytest.raises(UserError, match="'five'"):
        parse_threshold("five")
