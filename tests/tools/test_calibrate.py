"""tools/calibrate.py: the shipped regression gate on synthetic A/A and A/B pairs resampled from
recorded H100 step times (tests/fixtures/runs), and the pairing of real runs."""

from pathlib import Path

import pytest

from bench.stats.ranktests import min_samples
from tools.calibrate import real_distributions, shipped_defaults, synthetic_trials

RUNS = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "runs"


@pytest.fixture(scope="module")
def recorded():
    dists = real_distributions(sorted(RUNS.glob("*/steps.parquet")))
    assert len(dists) >= 50  # the 51 cells of the 2- and 4-GPU H100 runs with 10+ timed steps
    return dists


def test_real_pair_bookkeeping(tmp_path):
    """tools.calibrate's pairing of real runs (without making runs): A/A and A/B rows per pair,
    runs pooled as repeats, and the history variant; the slowed twin is compared as its target."""
    import argparse

    from tests.regress_helpers import write_run
    from tools.calibrate import history_pairs, real_pairs

    runs = [write_run(tmp_path / f"2026-{i}", {"single": 1.0, "slow5": 1.3}, seed=i, noise=0.002)
            for i in range(6)]
    args = argparse.Namespace(strategy="single", slow="slow5", threshold=0.05)
    one = real_pairs(runs, args, 1)
    assert len(one) == 2 * 5 and set(one["kind"]) == {"A/A", "A/B +5%"}
    slowed = one[one["kind"] == "A/B +5%"]  # the shipped default: one run a side asks for repeats
    assert (slowed["verdict"] == "noisy").all() and (slowed["verdict_single_run"] == "regression").all()
    pooled = real_pairs(runs, args, 3)
    assert len(pooled) == 2 and (pooled["unit"] == "repeats").all()
    hist = history_pairs(runs, args, k=4)
    assert len(hist) == 4 and (hist["unit"] == "runs").all()
    assert (hist.loc[hist["kind"] == "A/A", "verdict"] != "regression").all()


@pytest.mark.parametrize("repeats", [1, 5, 7, 10])
def test_calibration_of_the_shipped_gate(recorded, repeats):
    """The gate as `parbench compare` runs it by default (require_repeats on), on 204 synthetic A/A
    and 204 A/B (+5%) pairs resampled from real GPU step times: <= 1% of A/A pairs fail at every
    repeats count. One run a side never fails, by design (what is not `same` is `noisy`); from 5
    repeats a side (the fewest that can reach alpha) the 5% slowdown is caught in >= 95% of the
    pairs whose noise floor resolves it, and a miss is never silent."""
    assert shipped_defaults()["require_repeats"] is True
    aa = synthetic_trials(recorded, trials=204, slowdown=0.0, repeats=repeats, seed=1)
    ab = synthetic_trials(recorded, trials=204, slowdown=0.05, repeats=repeats, seed=2)
    assert (aa["verdict"] == "regression").mean() <= 0.01
    if repeats < min_samples():
        for t in (aa, ab):
            assert set(t["verdict"]) <= {"same", "noisy"}
        caught = ab["note"].str.contains("--single-run")  # what --single-run would have failed
        assert caught.sum() >= 60 and (ab.loc[caught, "verdict"] == "noisy").all()
    else:
        resolvable = ab[ab["noise_floor"] <= 0.05]
        assert len(resolvable) >= 60
        assert (resolvable["verdict"] == "regression").mean() >= 0.95
        assert set(ab["verdict"]) <= {"regression", "noisy", "same"}
        assert (ab.loc[ab["noise_floor"] > 0.05, "verdict"] != "same").all()
