"""bench/baselines/pool.py: interleave results pooled across calls (synthetic records, a .tgz with a
member filter, the committed twelfth-stop runs) and its bad inputs."""

from __future__ import annotations

import io
import json
import math
import tarfile
from pathlib import Path

import pytest

from bench.baselines import pool

ROOT = Path(__file__).resolve().parents[2]
STOP12 = ROOT / "docs" / "runs" / "stop12-h100-x4"


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


def test_a_mixed_set_is_not_significant_and_a_shifted_set_differs(tmp_path):
    mixed = _write(tmp_path / "m.json", _doc("fsdp", [0.099, 0.103, 0.097, 0.102, 0.100, 0.101],
                                            [0.100, 0.100, 0.100, 0.100, 0.1005, 0.100]))
    shifted = _write(tmp_path / "s.json", _doc("fsdp", [0.120, 0.125, 0.119, 0.122, 0.121, 0.124],
                                              [0.100] * 6))
    (m,) = pool.pooled(pool.load(mixed))
    assert m["p_wilcoxon"] > 0.5 and m["geomean_ci"][0] < 1 < m["geomean_ci"][1]
    (c,) = pool.compare(pool.pooled(pool.load(mixed)), pool.pooled(pool.load(shifted)))
    assert c["p_mannwhitney"] < 0.01 and c["vs_geomean"] > 1.19


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


def test_the_committed_twelfth_stop_fsdp_rounds():
    """The numbers docs/RESULTS.md gives for FSDP x4 with --profile-at end (twelfth stop)."""
    rows = pool.pooled(pool.load(f"{STOP12}/fsdp-x4-pass-end-inline.tgz::pass-end")
                       + pool.load(str(STOP12 / "fsdp-x4-end-6rounds.tgz")), "fsdp", 4)
    (row,) = rows
    assert row["n"] == 8 and row["rounds_harness_slower"] == 5
    assert row["ratio_median"] == pytest.approx(1.025, abs=5e-4) and row["geomean"] == pytest.approx(1.007, abs=5e-4)
    assert row["p_wilcoxon"] == pytest.approx(0.64, abs=0.01) and row["floor"] == pytest.approx(0.194, abs=1e-3)


@pytest.mark.parametrize("make, message", [
    (lambda d: str(d / "missing.json"), "does not exist"),
    (lambda d: str(d), "holds no interleave.json"),
    (lambda d: _write(d / "x.json", {"runs": 3}), "no 'runs' list"),
    (lambda d: (d / "bad.json").write_text("{nope") and str(d / "bad.json"), "is not JSON"),
    (lambda d: (d / "bad.tgz").write_bytes(b"not a tar") and str(d / "bad.tgz"), "not a readable .tgz"),
    (lambda d: _write(d / "y.json", _doc("fsdp", [0.1], [0.1])) + "::end", "selects members of a .tgz"),
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


def test_main_prints_both_sets_and_the_comparison(tmp_path, capsys):
    a = _write(tmp_path / "a.json", _doc("fsdp", [0.101, 0.099, 0.1], [0.1, 0.1, 0.1]))
    b = _write(tmp_path / "b.json", _doc("fsdp", [0.11, 0.12, 0.115], [0.1, 0.1, 0.1]))
    assert pool.main([a, "--vs", b]) == 0
    out = capsys.readouterr().out
    assert "(first set)" in out and "(--vs set)" in out and "Mann-Whitney U p =" in out
    assert pool.main([a, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["set"][0]["n"] == 3 and doc["vs"] == [] and doc["compare"] == []
