"""The append-only history: add, step detection over commits, trend figures, compare against it."""

import json

import numpy as np
import pytest

from bench.core.errors import UserError
from bench.gate.history import add, baseline, fingerprint, read_index, show
from bench.results.run import load_run
from bench.stats.changepoints import detect_steps
from tests.regress_helpers import frames_compare, write_run


def fill(tmp_path, levels, store=None, **kw):
    """One run per commit c0, c1, ... with step time levels[i]; returns the store path."""
    store = store or tmp_path / "hist"
    for i, t in enumerate(levels):
        add(write_run(tmp_path / f"run{i}", {"ddp": t, "single": 1.0}, commit=f"c{i}", seed=i, **kw), store)
    return store


def test_add_is_append_only(tmp_path):
    run = write_run(tmp_path / "r", {"ddp": 1.0})
    e = add(run, tmp_path / "h")
    assert e["commit"] == "c0" and e["machine"] == fingerprint(json.loads((run / "meta.json").read_text()))
    with pytest.raises(UserError, match="already in"):
        add(run, tmp_path / "h")
    before = (tmp_path / "h" / "index.jsonl").read_text()
    add(write_run(tmp_path / "r2", {"ddp": 1.0}), tmp_path / "h")
    assert (tmp_path / "h" / "index.jsonl").read_text().startswith(before)
    assert read_index(tmp_path / "h")["seq"].tolist() == [0, 1]


def test_add_needs_a_commit(tmp_path):
    run = write_run(tmp_path / "r", {"ddp": 1.0}, commit=None)
    with pytest.raises(UserError, match="--commit"):
        add(run, tmp_path / "h")
    assert add(run, tmp_path / "h", commit="abc", machine="ci-cpu")["machine"] == "ci-cpu"
    with pytest.raises(UserError, match="machine name"):
        add(write_run(tmp_path / "r3", {"ddp": 1.0}), tmp_path / "h", machine="../x")


def test_fingerprint_follows_the_machine():
    a = {"host": "h", "gpus": ["H100", "H100"], "torch": "2.13", "nccl": "2.28", "cpu": "x"}
    assert fingerprint(a) == fingerprint({**a, "run_id": "other", "gpus": ["H100", "H100"]})
    for k, v in (("gpus", ["H200"]), ("torch", "2.12"), ("nccl", "2.27"), ("host", "g")):
        assert fingerprint(a) != fingerprint({**a, k: v})
    no_cpu = {k: v for k, v in a.items() if k != "cpu"}
    assert fingerprint({**no_cpu, "fingerprint": {"cpu_model": "EPYC"}, "platform": "Linux"}) != \
        fingerprint({**no_cpu, "fingerprint": {"cpu_model": "Xeon"}, "platform": "Linux"})


def test_detect_steps():
    rng = np.random.default_rng(0)
    y = np.r_[np.full(12, 1.0), np.full(10, 1.2)] + rng.normal(0, 0.01, 22)
    assert detect_steps(y) == [0, 12]
    assert detect_steps(1.0 + rng.normal(0, 0.01, 30)) == [0]
    assert detect_steps([1.0, 1.0]) == [0]


def test_show_finds_the_regression_commit_and_draws(tmp_path):
    store = fill(tmp_path, [1.0] * 5 + [1.2] * 4)
    t = show(store, plots=tmp_path / "png").set_index("cell")
    ddp = t.loc["w/ddp/gloo/cpu/ws2"]
    assert ddp["commits"] == 9 and ddp["regressions"] == 1 and ddp["changes"].startswith("c5 +")
    assert ddp["stable_since"] == "c5" and ddp["stable_s"] == pytest.approx(1.2, rel=0.01)
    assert t.loc["w/single/gloo/cpu/ws2", "regressions"] == 0
    assert (tmp_path / "png" / "w_ddp_gloo_cpu_ws2.png").stat().st_size > 1000


def test_show_needs_one_machine(tmp_path):
    store = fill(tmp_path, [1.0])
    add(write_run(tmp_path / "other", {"ddp": 1.0}, meta={"host": "elsewhere"}), store)
    with pytest.raises(UserError, match="--machine"):
        show(store)
    with pytest.raises(UserError, match="no history"):
        show(tmp_path / "empty")


def test_compare_against_the_last_stable_value(tmp_path):
    store = fill(tmp_path, [1.0] * 4 + [1.2] * 4)
    base, samples, meta = baseline(store)
    assert samples[0].unit == "runs" and len(samples[0].values) == 4  # the stable segment's runs only
    _, pooled, _ = baseline(store, min_runs=5)
    assert pooled[0].unit == "steps" and len(pooled[0].values) == 4 * 30
    for t, verdict in ((1.2, "same"), (1.3, "regression"), (1.0, "improvement")):
        cells, steps, m = load_run(write_run(tmp_path / f"cur{t}", {"ddp": t, "single": 1.0}, seed=99))
        out = frames_compare(base, cells, 0.05, base_samples=samples, cur_steps=steps, base_meta=meta,
                      cur_meta=m).set_index("strategy")
        assert out.loc["ddp", "verdict"] == verdict
    cells, steps, m = load_run(write_run(tmp_path / "newtorch", {"ddp": 1.2}, meta={"torch": "9"}))
    with pytest.raises(UserError, match="torch"):
        frames_compare(base, cells, 0.05, base_samples=samples, cur_steps=steps, base_meta=meta, cur_meta=m)


def test_repeats_are_not_runs(tmp_path):
    """Repeats of one run share its drift: a history's baseline has one value per run. 2 runs x 5
    repeats are 2 runs (too few for the run test: pooled, and the note says so), not 10."""
    two = fill(tmp_path / "a", [1.0, 1.0], repeats=5, n=10)
    _, samples, _ = baseline(two)
    assert samples[0].unit == "repeats" and samples[0].runs == 2 and len(samples[0].values) == 10
    five = fill(tmp_path / "b", [1.0] * 5, repeats=3, n=10)
    base, samples, meta = baseline(five)
    assert samples[0].unit == "runs" and len(samples[0].values) == 5
    cells, steps, m = load_run(write_run(tmp_path / "cur", {"ddp": 1.0, "single": 1.0}, repeats=3, n=10, seed=99))
    out = frames_compare(base, cells, 0.05, base_samples=samples, cur_steps=steps, base_meta=meta,
                  cur_meta=m).set_index("strategy")
    assert out.loc["ddp", "unit"] == "runs" and out.loc["ddp", "n_base"] == 5 and out.loc["ddp", "n_cur"] == 3
    base, samples, meta = baseline(two)
    out = frames_compare(base, cells, 0.05, base_samples=samples, cur_steps=steps, base_meta=meta,
                  cur_meta=m).set_index("strategy")
    assert out.loc["ddp", "unit"] == "repeats" and "holds 2 run(s), too few" in out.loc["ddp", "note"]


def test_fail_from_runs_reports_a_pooled_regression(tmp_path):
    """A clear slowdown against a one-run history (pooled repeats) fails by default and is only
    reported (noisy, with the reason) under fail_from_runs=4, as the CI workflow asks."""
    store = fill(tmp_path, [1.0], repeats=5, n=10)
    base, samples, meta = baseline(store)
    cells, steps, m = load_run(write_run(tmp_path / "cur", {"ddp": 1.5, "single": 1.0}, repeats=5, n=10, seed=7))
    kw = dict(base_samples=samples, cur_steps=steps, base_meta=meta, cur_meta=m)
    assert frames_compare(base, cells, 0.05, **kw).set_index("strategy").loc["ddp", "verdict"] == "regression"
    out = frames_compare(base, cells, 0.05, fail_from_runs=4, **kw).set_index("strategy")
    assert out.loc["ddp", "verdict"] == "noisy"
    assert "pooled samples of 1 history run(s)" in out.loc["ddp", "note"]
    assert out.loc["single", "verdict"] == "same"


def test_a_damaged_store_loads_the_rest_and_says_what_it_left_out(tmp_path, caplog):
    store = fill(tmp_path, [1.0, 1.0, 1.0])
    index = store / "index.jsonl"
    index.write_text(index.read_text() + '{"seq": 3, "comm')  # an add stopped by a full disk
    third = next(store.glob("*/000002-*.parquet"))
    third.write_bytes(third.read_bytes()[:50])
    with caplog.at_level("WARNING", logger="parbench"):
        table = show(store)
    assert table["commits"].tolist() == [2, 2]
    assert "index.jsonl line 4 skipped: not JSON" in caplog.text and third.name in caplog.text
    add(write_run(tmp_path / "r9", {"ddp": 1.0, "single": 1.0}, commit="c9"), store)  # on a line of its own
    assert read_index(store)["seq"].tolist() == [0, 1, 2, 3]


def test_a_failed_add_leaves_the_store_as_it_was(tmp_path, monkeypatch):
    store = fill(tmp_path, [1.0])
    before = sorted(p.name for p in store.rglob("*"))

    def full(*_a):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("bench.gate.history._append_line", full)
    with pytest.raises(UserError, match="No space left on device"):
        add(write_run(tmp_path / "r9", {"ddp": 1.0}, commit="c9"), store)
    assert sorted(p.name for p in store.rglob("*")) == before
