"""tools/baselines/pool.py: interleave results pooled across calls (synthetic records, a .tgz with a
member filter, committed H100 FSDP x4 rounds) and its bad inputs."""

from __future__ import annotations

import io
import json
import math
import tarfile
from pathlib import Path

import pytest

from tools.baselines import pool

ROOT = Path(__file__).resolve().parents[2]
FIX = ROOT / "tests" / "fixtures" / "pool"


def _doc(family: str, harness: list[float], plain: list[float], ws: int = 4) -> dict:
    runs = []
    for k, (h, p) in enumerate(zip(harness, plain)):
        for side, t in (("harness", h), ("plain", p)):
            runs.append({"side": side, "round": k, "family": family, "world_size": ws, "ok": True,
                         "median_s": t, "mean_s": t, "global_batch": 64})
    return {"args": {}, "runs": runs}


def _write(path: Path, doc: dict) -> str:
    path.write_text(json.dumps(doc))
    return str(path)


def test_rounds_of_two_calls_pool_into_one_test(tmp_path):
    a = _write(tmp_path / "a.json", _doc("fsdp", [0.110, 0.120, 0.105], [0.100, 0.100, 0.100]))
    b = _write(tmp_path / "b.json", _doc("fsdp", [0.104, 0.111], [0.100, 0.100]))
    (row,) = pool.pooled(pool.load(a) + pool.load(b))
    ratios = [1.10, 1.20, 1.05, 1.04, 1.11]
    assert row["n"] == 5 and len(row["calls"]) == 2 and row["ratios"] == pytest.approx(ratios)
    assert row["ratio_median"] == pytest.approx(1.10) and row["rounds_harness_slower"] == 5
    assert row["geomean"] == pytest.approx(math.exp(sum(map(math.log, ratios)) / 5))
    lo, hi = row["geomean_ci"]
    assert 1 < lo < row["geomean"] < hi
    assert row["p_wilcoxon"] == pytest.approx(0.0625)  # all 5 one way: the smallest exact p at n = 5
    assert row["floor"] == 0.0  # each call's plain side did not move


def test_rounds_pair_by_round_number_not_by_record_order(tmp_path):
    """ABBA order, plain times that move by round, and round 2's plain run missing: round k's harness
    is divided by round k's plain, and round 2 is not compared."""
    runs = [
        {"side": "harness", "round": 0, "median_s": 0.110},
        {"side": "plain", "round": 0, "median_s": 0.100},
        {"side": "plain", "round": 1, "ok": False, "error": "timeout"},
        {"side": "harness", "round": 1, "median_s": 0.300},
        {"side": "harness", "round": 2, "median_s": 0.240},
        {"side": "plain", "round": 2, "median_s": 0.200},
        {"side": "plain", "round": 3, "median_s": 0.050},
        {"side": "harness", "round": 3, "median_s": 0.050},
    ]
    for r in runs:
        r.update(family="fsdp", world_size=4, ok=r.get("ok", True), global_batch=64)
        if r["ok"]:
            r["mean_s"] = r["median_s"]
    (row,) = pool.pooled(pool.load(_write(tmp_path / "abba.json", {"args": {}, "runs": runs})))
    assert row["n"] == 3 and row["ratios"] == pytest.approx([1.10, 1.20, 1.00])
    assert row["rounds_harness_slower"] == 2  # a ratio of exactly 1 is not "slower"
    assert row["floor"] == pytest.approx(0.200 / 0.050 - 1)


def test_the_interval_is_a_t_interval_of_the_log_ratios(tmp_path):
    from scipy import stats

    ratios = [1.10, 0.95, 1.03, 1.20]
    doc = _doc("ddp", [0.1 * x for x in ratios], [0.1] * 4)
    (row,) = pool.pooled(pool.load(_write(tmp_path / "t.json", doc)))
    logs = [math.log(x) for x in ratios]
    mean = sum(logs) / 4
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / 3)  # n - 1
    half = stats.t.ppf(0.975, 3) * sd / 2
    assert row["geomean_ci"] == pytest.approx((math.exp(mean - half), math.exp(mean + half)), rel=1e-9)


def test_a_mixed_set_is_not_significant_and_a_shifted_set_differs(tmp_path):
    mixed = _write(tmp_path / "m.json", _doc("fsdp", [0.099, 0.103, 0.097, 0.102, 0.100, 0.101],
                                            [0.100, 0.100, 0.100, 0.100, 0.1005, 0.100]))
    shifted = _write(tmp_path / "s.json", _doc("fsdp", [0.120, 0.125, 0.119, 0.122, 0.121, 0.124],
                                              [0.100] * 6))
    (m,) = pool.pooled(pool.load(mixed))
    assert m["p_wilcoxon"] > 0.5 and m["geomean_ci"][0] < 1 < m["geomean_ci"][1]
    (c,) = pool.compare(pool.pooled(pool.load(mixed)), pool.pooled(pool.load(shifted)))
    assert c["p_mannwhitney"] < 0.01 and c["vs_geomean"] > 1.19
    (back,) = pool.compare(pool.pooled(pool.load(shifted)), pool.pooled(pool.load(mixed)))
    assert back["p_mannwhitney"] == pytest.approx(c["p_mannwhitney"])  # two-sided: either order


def test_a_tgz_member_filter_and_the_family_filter(tmp_path):
    arc = tmp_path / "runs.tgz"
    with tarfile.open(arc, "w:gz") as tar:
        for name, doc in (("pass-end/interleave.json", _doc("fsdp", [0.11], [0.10])),
                          ("pass-inline/interleave.json", _doc("fsdp", [0.09, 0.095], [0.10, 0.10])),
                          ("pass-end/other.txt", {"x": 1})):
            data = json.dumps(doc).encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    assert [n for n, _ in pool.load(str(arc))] == [f"{arc}::pass-end/interleave.json",
                                                  f"{arc}::pass-inline/interleave.json"]
    (row,) = pool.pooled(pool.load(f"{arc}::pass-inline"))
    assert row["n"] == 2 and row["rounds_harness_slower"] == 0
    assert pool.pooled(pool.load(str(arc)), family="ddp") == []
    assert pool.pooled(pool.load(str(arc)), world_size=4)[0]["n"] == 3


def test_the_committed_fsdp_rounds_with_the_profile_pass_at_the_end():
    """The numbers docs/RESULTS.md gives for FSDP x4 with --profile-at end (4x H100, 2026-11-27)."""
    rows = pool.pooled(pool.load(f"{FIX}/fsdp-x4-pass-end-inline.tgz::pass-end")
                       + pool.load(str(FIX / "fsdp-x4-end-30steps.json")), "fsdp", 4)
    (row,) = rows
    assert row["n"] == 8 and row["rounds_harness_slower"] == 5
    assert row["ratio_median"] == pytest.approx(1.025, abs=5e-4) and row["geomean"] == pytest.approx(1.007, abs=5e-4)
    assert row["p_wilcoxon"] == pytest.approx(0.64, abs=0.01) and row["floor"] == pytest.approx(0.194, abs=1e-3)
    assert row["geomean_ci"] == pytest.approx((0.931, 1.090), abs=5e-4)


def test_the_committed_fsdp_rounds_with_and_without_a_profiler_session_before_timing():
    """docs/RESULTS.md: 11 FSDP x4 rounds without a GPU profiler session before the timed steps
    against 9 with one (4x H100, 2026-11-27, five calls)."""
    without = pool.pooled(pool.load(str(FIX / "fsdp-x4-profile0.json"))
                          + pool.load(f"{FIX}/fsdp-x4-pass-end-inline.tgz::pass-end")
                          + pool.load(str(FIX / "fsdp-x4-end-30steps.json")), "fsdp", 4)
    with_ = pool.pooled(pool.load(str(FIX / "fsdp-tensor-sp-x4-profile2.json"))
                        + pool.load(str(FIX / "fsdp-x4-profile2.json"))
                        + pool.load(f"{FIX}/fsdp-x4-pass-end-inline.tgz::pass-inline"), "fsdp", 4)
    assert (without[0]["n"], with_[0]["n"]) == (11, 9)
    assert without[0]["geomean"] == pytest.approx(1.001, abs=5e-4)
    assert with_[0]["geomean"] == pytest.approx(1.051, abs=5e-4)
    assert without[0]["p_wilcoxon"] == pytest.approx(0.765, abs=1e-3)
    (c,) = pool.compare(without, with_)
    assert c["p_mannwhitney"] == pytest.approx(0.503, abs=1e-3)  # exact: no ties


def test_one_call_pooled_twice_is_refused(tmp_path, capsys):
    doc = _doc("fsdp", [0.11, 0.12], [0.1, 0.1])
    doc["runs"][0]["row"] = {"run_id": "20261127-000000-abcd"}
    a, b = _write(tmp_path / "a.json", doc), _write(tmp_path / "copy.json", doc)
    assert pool.main([a, b]) == 2 and "same harness run 20261127-000000-abcd" in capsys.readouterr().err
    assert pool.main([a, "--vs", b]) == 2 and "same harness run" in capsys.readouterr().err
    assert pool.main([a, a]) == 2 and "named twice" in capsys.readouterr().err


def test_malformed_records_are_left_out_and_counted(tmp_path, capsys):
    doc = _doc("fsdp", [0.11, 0.12, 0.13], [0.1, 0.1, 0.1])
    doc["runs"][0]["median_s"] = float("inf")  # round 1 harness
    doc["runs"][2]["world_size"] = "4"  # round 2 harness
    doc["runs"] += [{"side": "harness", "round": [1], "family": "fsdp", "world_size": 4, "ok": True},
                    {"side": "plain", "round": 0, "family": "fsdp", "world_size": 4, "ok": True,
                     "median_s": True, "mean_s": 0.1},
                    {"side": "plain", "round": 5, "family": "fsdp", "world_size": 4, "ok": False, "error": None},
                    {"side": "harness", "round": 4, "family": "fsdp", "world_size": 4, "ok": True,
                     "median_s": 0.1, "mean_s": 0.1, "row": [1], "global_batch": "abc"}, 7]
    path = _write(tmp_path / "m.json", doc)
    (row,) = pool.pooled(pool.load(path))
    assert row["n"] == 1 and row["ratios"] == pytest.approx([1.3])
    assert pool.main([path]) == 0
    assert "6 malformed record(s) left out"  # the failed record with error None is fine in capsys.readouterr().out


def test_settings_that_differ_between_pooled_calls_are_noted(tmp_path, capsys):
    a, b = _doc("fsdp", [0.11, 0.1], [0.1, 0.1]), _doc("fsdp", [0.1, 0.1], [0.1, 0.1])
    a["args"], b["args"] = {"steps": 8, "global_batch": 64}, {"steps": 30, "global_batch": 64}
    assert pool.main([_write(tmp_path / "a.json", a), _write(tmp_path / "b.json", b)]) == 0
    out = capsys.readouterr().out
    assert "differ in steps [30, 8]" in out and "global_batch" not in out


@pytest.mark.parametrize("make, message", [
    (lambda d: str(d / "missing.json"), "does not exist"),
    (lambda d: str(d), "holds no interleave.json"),
    (lambda d: _write(d / "x.json", {"runs": 3}), "no 'runs' list"),
    (lambda d: (d / "bad.json").write_text("{nope") and str(d / "bad.json"), "is not JSON"),
    (lambda d: (d / "bad.tgz").write_bytes(b"not a tar") and str(d / "bad.tgz"), "not a readable .tgz"),
    (lambda d: _write(d / "y.json", _doc("fsdp", [0.1], [0.1])) + "::end", "selects members of a .tgz"),
    (lambda d: (d / "deep.json").write_text("[" * 100000) and str(d / "deep.json"), "is not JSON"),
    (lambda d: "/dev/null", "not a regular file"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, make, message):
    assert pool.main([make(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("pool: ") and message in err


def test_a_record_without_a_step_time_is_left_out(tmp_path):
    doc = _doc("fsdp", [0.11, 0.12], [0.1, 0.1])
    del doc["runs"][0]["median_s"]  # round 1's harness record: no time, so round 1 is not compared
    (row,) = pool.pooled(pool.load(_write(tmp_path / "r.json", doc)))
    assert row["n"] == 1 and row["ratios"] == pytest.approx([1.2])


def test_no_compared_round_is_exit_2(tmp_path, capsys):
    doc = _doc("fsdp", [0.1], [0.1])
    for r in doc["runs"]:
        r["ok"] = False
    assert pool.main([_write(tmp_path / "f.json", doc)]) == 2
    assert "no compared rounds" in capsys.readouterr().err


def test_a_vs_set_with_nothing_in_common_is_exit_2(tmp_path, capsys):
    a = _write(tmp_path / "a.json", _doc("fsdp", [0.11, 0.1], [0.1, 0.1]))
    b = _write(tmp_path / "b.json", _doc("ddp", [0.11, 0.1], [0.1, 0.1]))
    assert pool.main([a, "--vs", b]) == 2 and "nothing to compare" in capsys.readouterr().err


def test_main_prints_both_sets_and_the_comparison(tmp_path, capsys):
    a = _write(tmp_path / "a.json", _doc("fsdp", [0.101, 0.099, 0.1], [0.1, 0.1, 0.1]))
    b = _write(tmp_path / "b.json", _doc("fsdp", [0.11, 0.12, 0.115], [0.1, 0.1, 0.1]))
    assert pool.main([a, "--vs", b]) == 0
    out = capsys.readouterr().out
    assert "(first set)" in out and "(--vs set)" in out and "Mann-Whitney U p =" in out
    assert pool.main([a, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["set"][0]["n"] == 3 and doc["vs"] == [] and doc["compare"] == [] and doc["notes"] == []
