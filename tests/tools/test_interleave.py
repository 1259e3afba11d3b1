"""tools/baselines/interleave.py's logic without processes: the noise verdict, the table built from
records (synthetic and a committed GPU run), the global batch check."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIX2 = ROOT / "tests" / "fixtures" / "interleave" / "h100-x2-launch-bound.json"


def _records(family: str, harness: list[float], plain: list[float], gb_h=16, gb_p=16) -> list[dict]:
    """Synthetic interleave records: one harness and one plain record per round (medians in s)."""
    out = []
    for k, (h, p) in enumerate(zip(harness, plain)):
        for side, t, gb in (("harness", h, gb_h), ("plain", p, gb_p)):
            g = gb[k] if isinstance(gb, list) else gb
            out.append({"side": side, "round": k, "family": family, "world_size": 2, "ok": True,
                        "median_s": t, "mean_s": t, "global_batch": g})
    return out


def _table(runs: list[dict], families: list[str]) -> dict[str, dict]:
    from tools.baselines.interleave import State, table

    return {r["family"]: r for r in table(State(args={}, runs=runs), families, [2])}


def test_interleave_verdict_rule():
    from tools.baselines.interleave import verdict

    assert verdict([1.005, 0.995, 1.01], 0.30) == "within 1%"  # within 1% whatever the floor
    assert verdict([1.10, 1.12, 1.08], 0.03) == "harness slower"
    assert verdict([0.90, 0.88, 0.92], 0.03) == "harness faster"
    assert verdict([1.10, 1.12, 1.08], 0.20) == "inside noise (floor 20.0%)"  # effect < floor
    assert verdict([1.10, 0.98, 1.12], 0.01) == "inside noise (floor 1.0%)"  # not every round agrees
    assert verdict([0.95, 0.97, 1.02], 0.01).startswith("inside noise")
    assert verdict([1.02, 1.011], 0.0) == "harness slower"  # one ratio past 1.01: not within 1%
    assert verdict([1.5], 0.0) == "too few rounds"
    assert verdict([], None) == "too few rounds"
    # the same rule for another A/B (the two-agent script): its tolerance and its side's name
    assert verdict([1.03, 0.97, 1.049], 0.30, tolerance=0.05, side="two agents") == "within 5%"
    assert verdict([1.31, 1.29, 1.35], 0.12, tolerance=0.05, side="two agents") == "two agents slower"
    assert verdict([1.31, 1.29, 1.35], 0.40, tolerance=0.05, side="two agents") == "inside noise (floor 40.0%)"


def test_interleave_table_reaches_each_verdict_from_records():
    runs = (_records("ddp", [0.1005, 0.0995, 0.1002], [0.1, 0.1, 0.1])
            + _records("fsdp", [0.110, 0.112, 0.111], [0.100, 0.101, 0.1005])
            + _records("tensor", [0.090, 0.089, 0.091], [0.100, 0.101, 0.1005])
            + _records("pipeline-1f1b", [0.110, 0.112, 0.111], [0.100, 0.125, 0.110]))
    rows = _table(runs, ["ddp", "fsdp", "tensor", "pipeline-1f1b"])
    assert rows["ddp"]["verdict"] == "within 1%"
    assert rows["fsdp"]["verdict"] == "harness slower" and rows["fsdp"]["rounds_harness_slower"] == 3
    assert rows["tensor"]["verdict"] == "harness faster" and rows["tensor"]["rounds_harness_slower"] == 0
    pp = rows["pipeline-1f1b"]
    assert pp["plain_spread"] == pytest.approx(0.25) and pp["verdict"] == "inside noise (floor 25.0%)"
    assert pp["rounds_harness_slower"] == 2 and pp["n"] == 3 and pp["global_batch"] == [16]


def test_interleave_round_with_mismatched_global_batch_is_not_compared():
    runs = _records("ddp", [0.11, 0.2, 0.11], [0.1, 0.1, 0.1], gb_h=64, gb_p=[64, 16, 64])
    row = _table(runs, ["ddp"])["ddp"]
    assert row["n"] == 2 and row["ratios"] == pytest.approx([1.1, 1.1])
    assert row["global_batch"] == [64] and row["verdict"] == "harness slower"
    assert row["round_notes"] == ["round 2 not compared: global batch harness 64 != plain 16"]


def test_interleave_verdicts_of_a_real_launch_bound_run():
    """2x H100, gpt-200m at global batch 16, 3 rounds: launch-bound, the plain loops' round medians
    move by 39-60%, so no family's gap is resolved. The plain lines of that run carry no global batch
    (older programs): such rounds count as matching."""
    from tools.baselines.interleave import State, print_table, table

    d = json.loads(FIX2.read_text())
    rows = table(State(args=d["args"], runs=d["runs"]), d["args"]["families"], d["args"]["world_sizes"])
    print_table(rows)
    by = {r["family"]: r for r in rows}
    assert all(r["n"] == 3 and r["global_batch"] == [16] for r in rows)
    assert sum(r["verdict"].startswith("inside noise") for r in rows) >= 1
    ddp = by["ddp"]  # round medians 58.3, 45.3, 63.0 ms
    assert ddp["plain_spread"] == pytest.approx(0.063012 / 0.045332 - 1, rel=1e-3)
    assert ddp["rounds_harness_slower"] == 1 and ddp["verdict"] == "inside noise (floor 39.0%)"
    # the old table's numbers are unchanged
    old = {r["family"]: r for r in d["table"]}
    for fam, r in by.items():
        assert r["ratio_median"] == pytest.approx(old[fam]["ratio_median"])


def test_interleave_refuses_a_global_batch_one_side_cannot_take():
    import argparse

    from tools.baselines.interleave import check_batch, parse_dims

    args = argparse.Namespace(global_batch=4, _cli_help="--global-batch GLOBAL_BATCH")
    check_batch(args, ["ddp", "fsdp", "tensor"], [2, 4])
    with pytest.raises(SystemExit, match="micro-batches"):
        check_batch(args, ["pipeline-1f1b"], [2])
    with pytest.raises(SystemExit, match="do not divide"):
        check_batch(argparse.Namespace(global_batch=6, _cli_help="--global-batch"), ["ddp"], [4])
    with pytest.raises(SystemExit, match="no --global-batch flag"):
        check_batch(argparse.Namespace(global_batch=8, _cli_help="--steps"), ["ddp"], [2])
    check_batch(argparse.Namespace(global_batch=64, _cli_help="--global-batch"), ["pipeline-gpipe"], [2])
    assert parse_dims("n_layer=4, d_model=128") == {"n_layer": 4, "d_model": 128}
    with pytest.raises(SystemExit, match="KEY=<integer>"):
        parse_dims("n_layer")


