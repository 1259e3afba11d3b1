"""tools/baselines/interleave.py's logic without processes: the noise verdict, the table built from
records (synthetic and a committed GPU run), the global batch check, and the commands of the pairs
(pairs.py) with the training knobs on both sides and the one-device families at world size 1."""

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


# ---- the pairs' commands: the training knobs on both sides, world size 1 -----------------------

#: What a `parbench run --help` lists, with and without the training knobs (the harness gains them).
PINS = "  --warmup-max N\n  --steps-max N\n  --budget B\n"
HELP_KNOBS = "usage: [--optimizer OPTIMIZER] [--compile COMPILE]\n  --ac AC\n" + PINS
HELP_OLD = "  --compile-mode M\n" + PINS


def _args(argv: list[str], help_text: str = HELP_KNOBS):
    from tools.baselines.interleave import parse_args

    args, fams, worlds = parse_args(["--device", "cpu", "--workload", "gpt-tiny", *argv])
    args._cli_help = help_text  # no `parbench run --help` process
    args.runs_dir = "runs"
    return args, fams, worlds


def _after(cmd: list[str], flag: str) -> str:
    assert cmd.count(flag) == 1, (flag, cmd)
    return cmd[cmd.index(flag) + 1]


def test_pairs_state_the_knobs_on_both_sides():
    """Each family's knobs, spelled for each side: the older families SGD both sides (the harness
    now defaults to AdamW, so it is told), the new ones AdamW alone, compiled, with full or
    selective checkpointing; single-* one device, world size 1 only."""
    from tools.baselines.pairs import PAIRS

    for fam in ("ddp", "ddp-tuned", "fsdp", "fsdp-fp32", "fsdp-noreshard"):
        assert PAIRS[fam].run_flags == ("--optimizer", "sgd") and not PAIRS[fam].one_device
        assert _after(list(PAIRS[fam].flags), "--optimizer") == "sgd", fam
    for fam in ("pipeline-gpipe", "pipeline-1f1b", "tensor", "tensor-sp"):  # SGD-only programs
        assert PAIRS[fam].run_flags == ("--optimizer", "sgd") and "--optimizer" not in PAIRS[fam].flags
    for side in ("single", "ddp", "fsdp"):
        strategy, program = {"single": ("single", "plain_ddp"), "ddp": ("ddp", "plain_ddp"),
                             "fsdp": ("fsdp", "plain_fsdp")}[side]
        expect = {"adamw": ((), ()), "compile": (("--compile", "on"), ("--compile",)),
                  "ac": (("--ac", "full"), ("--ac", "full")), "sac": (("--ac", "selective"), ("--ac", "selective"))}
        for suffix, (harness_extra, plain_extra) in expect.items():
            p = PAIRS[f"{side}-{suffix}"]
            assert (p.strategy, p.program, p.one_device) == (strategy, program, side == "single")
            assert p.run_flags == ("--optimizer", "adamw", *harness_extra)
            own = ("--no-ddp",) if side == "single" else ()
            assert p.flags == (*own, "--optimizer", "adamw", *plain_extra), p.flags
            assert p.compiled == (suffix == "compile")
    assert PAIRS["fsdp-compile"].options == ("fsdp_mp=auto",)


def test_a_program_without_the_knob_flags_cannot_be_paired_with_other_knobs():
    from tools.baselines.knobs import ADAMW, Knobs
    from tools.baselines.pairs import pair

    with pytest.raises(ValueError, match="SGD"):
        pair("tensor", (), "plain_tp", knobs=ADAMW)
    with pytest.raises(ValueError, match="optimizer"):
        Knobs("lamb")
    with pytest.raises(ValueError, match="ac"):
        Knobs("sgd", ac="some")


def test_compile_extends_the_warmup_on_both_sides():
    from tools.baselines.knobs import warmup_steps

    assert warmup_steps(3, False) == 3 and warmup_steps(0, False) == 0
    assert warmup_steps(1, True) == 7 and warmup_steps(5, True) == 7 and warmup_steps(9, True) == 11


def test_harness_command_of_a_one_device_compiled_family():
    """single-compile at --world-sizes 1: the harness's single strategy at world size 1 with the
    knobs as run flags and the compiled warm-up pinned; the plain side plain_ddp --no-ddp with the
    same knobs and the call's own --warmup (it extends it itself)."""
    from pathlib import Path

    from tools.baselines.interleave import State, harness_cmd, plain_flags

    args, fams, worlds = _args(["--families", "single-compile", "--world-sizes", "1", "--warmup", "2"])
    assert fams == ["single-compile"] and worlds == [1]
    state = State(args={})
    cmd = harness_cmd(fams, worlds, Path("out"), args, state)
    assert cmd[1:4] == ["-m", "bench", "run"]
    assert _after(cmd, "--strategies") == "single" and _after(cmd, "--world-sizes") == "1"
    assert _after(cmd, "--optimizer") == "adamw" and _after(cmd, "--compile") == "on" and "--ac" not in cmd
    assert _after(cmd, "--warmup") == "7" and _after(cmd, "--warmup-max") == "7" and "--option" not in cmd
    assert not state.dropped
    flags = plain_flags("single-compile", args)
    assert _after(flags, "--warmup") == "2" and flags[-4:] == ["--no-ddp", "--optimizer", "adamw", "--compile"]


def test_harness_command_of_the_default_families_says_sgd():
    from pathlib import Path

    from tools.baselines.interleave import State, harness_cmd, harness_groups

    args, fams, worlds = _args(["--world-sizes", "2,4"])
    state = State(args={})
    (group,) = harness_groups(fams, state, args)  # one call, as before the knobs
    cmd = harness_cmd(group, worlds, Path("out"), args, state)
    assert _after(cmd, "--optimizer") == "sgd" and "--compile" not in cmd and "--ac" not in cmd
    assert _after(cmd, "--warmup") == "5" and _after(cmd, "--world-sizes") == "2,4"


def test_run_flags_a_checkout_lacks_are_dropped_and_noted():
    """A `parbench run` without --optimizer/--compile/--ac (a longer flag of the same stem does not
    count): the flags are left out, with a note per family, as undeclared options are."""
    from pathlib import Path

    from tools.baselines.interleave import State, harness_cmd, table

    args, fams, worlds = _args(["--families", "ddp-compile", "--world-sizes", "2"], help_text=HELP_OLD)
    state = State(args={})
    cmd = harness_cmd(fams, worlds, Path("out"), args, state)
    assert "--optimizer" not in cmd and "--compile" not in cmd
    assert state.dropped["ddp-compile"] == ["--optimizer adamw (no such parbench run flag)",
                                            "--compile on (no such parbench run flag)"]
    harness_cmd(fams, worlds, Path("out"), args, state)  # noted once
    assert len(state.dropped["ddp-compile"]) == 2
    (row,) = table(state, fams, worlds)
    assert row["harness_options_dropped"] == state.dropped["ddp-compile"]


def test_harness_groups_share_run_flags():
    """Families share a harness call only with the same run flags: the knob families of one setting
    together (single beside ddp and fsdp), apart from the SGD families and from other settings."""
    from tools.baselines.interleave import State, harness_groups

    fams = "ddp,fsdp,single-adamw,ddp-adamw,fsdp-adamw,ddp-compile,fsdp-compile,single-ac,ddp-ac,ddp-sac"
    args, fams, _ = _args(["--families", fams, "--world-sizes", "1,2"])
    assert harness_groups(fams, State(args={}), args) == [
        ["ddp", "fsdp"], ["single-adamw", "ddp-adamw", "fsdp-adamw"], ["ddp-compile", "fsdp-compile"],
        ["single-ac", "ddp-ac"], ["ddp-sac"]]


def test_one_device_families_run_at_world_size_1_only(monkeypatch):
    """--world-sizes 1,2: a group of single-adamw and ddp-adamw runs one harness call at both
    sizes, the plain side of both at 1 and of ddp-adamw alone at 2; table rows exist only where a
    family runs (stray records of single-adamw at 2 are not tabled). Without a 1, a one-device
    family is refused before any run."""
    from tools.baselines import interleave as il

    args, fams, worlds = _args(["--families", "single-adamw,ddp-adamw", "--world-sizes", "1,2", "--repeats", "2"])
    calls = []
    monkeypatch.setattr(il, "run_harness", lambda g, ws, rnd, a, s: calls.append(("harness", rnd, g, ws)))
    monkeypatch.setattr(il, "run_plain", lambda g, w, rnd, a, s: calls.append(("plain", rnd, g, w)))
    monkeypatch.setattr(il, "save", lambda *a, **k: None)
    il.run_rounds([fams], worlds, args, il.State(args={}), Path("unused"))
    assert calls == [("harness", 0, fams, [1, 2]), ("plain", 0, fams, 1), ("plain", 0, ["ddp-adamw"], 2),
                     ("plain", 1, fams, 1), ("plain", 1, ["ddp-adamw"], 2), ("harness", 1, fams, [1, 2])]
    runs = [dict(r, world_size=w) for w in (1, 2) for f in fams for r in _records(f, [0.11, 0.11], [0.1, 0.1])]
    rows = il.table(il.State(args={}, runs=runs), fams, worlds)  # single-adamw's x2 records: no row
    assert [(r["family"], r["world_size"]) for r in rows] == [("single-adamw", 1), ("ddp-adamw", 1), ("ddp-adamw", 2)]
    with pytest.raises(SystemExit, match="add 1 to --world-sizes"):
        _args(["--families", "single-adamw,ddp", "--world-sizes", "2,4"])
    assert il.estimate_s([["single-compile"]], ["single-compile"], [1], args) > il.estimate_s(
        [["single-adamw"]], ["single-adamw"], [1], args)


def test_a_round_whose_sides_trained_with_different_knobs_is_not_compared():
    """The harness row says compile off/on, the plain line a boolean; a round whose knobs differ
    (a dropped run flag) is left out and noted; rows without knobs (older results) compare."""
    runs = _records("ddp-compile", [0.11, 0.2, 0.11], [0.1, 0.1, 0.1])
    for r in runs:
        harness = r["side"] == "harness"
        r["row"] = {"optimizer": "adamw", "ac": "none", "compile": ("on" if harness else True)}
    runs[2]["row"] = {"optimizer": "sgd", "ac": "none", "compile": "off"}  # round 2's harness: flags dropped
    runs[4]["row"] = {}  # round 3's harness: an older row, no knobs
    row = _table(runs, ["ddp-compile"])["ddp-compile"]
    assert row["n"] == 2 and row["ratios"] == pytest.approx([1.1, 1.1])
    assert row["round_notes"] == ["round 2 not compared: optimizer harness sgd != plain adamw, "
                                  "compile harness off != plain on"]
