"""The launcher's record of where a launch's time outside its cells went (meta.json group_starts)."""

import json

from bench.train.run_folder import startup_record


def test_phases_are_the_gaps_between_the_marks(tmp_path):
    prefix = tmp_path / "g0-a1"
    marks = {"process": 101.0, "imported": 104.5, "device": 106.0, "process_group": 108.0, "placed": 108.25,
             "warm": 109.0}
    (tmp_path / "g0-a1-leader.startup.json").write_text(json.dumps(marks))
    rec = startup_record("nccl x4", 1, 100.0, {"first_cell": 109.5, "last_cell": 150.0, "exited": 152.5}, prefix)
    assert rec["torchrun_s"] == 1.0 and rec["imports_s"] == 3.5 and rec["device_s"] == 1.5
    assert rec["process_group_s"] == 2.0 and rec["placement_s"] == 0.25 and rec["warm_up_s"] == 0.75
    assert rec["to_first_cell_s"] == 0.5 and rec["start_s"] == 9.5 and rec["teardown_s"] == 2.5
    assert rec["launched_unix"] == 100.0 and rec["exited_unix"] == 152.5


def test_a_launch_that_died_early_keeps_what_it_has(tmp_path):
    rec = startup_record("gloo x2", 2, 100.0, {"first_cell": None, "last_cell": None, "exited": 101.0},
                         tmp_path / "g1-a2")
    assert rec == {"group": "gloo x2", "attempt": 2, "launched_unix": 100.0, "exited_unix": 101.0}
    # a leader that wrote only some marks: the phases next to a missing mark are left out, not folded
    # into a neighbour
    (tmp_path / "g1-a3-leader.startup.json").write_text(json.dumps({"process": 101.0, "imported": 103.0,
                                                                 "warm": 110.0}))
    rec = startup_record("gloo x2", 3, 100.0, {"first_cell": 111.0}, tmp_path / "g1-a3")
    assert rec["imports_s"] == 2.0 and rec["to_first_cell_s"] == 1.0 and rec["start_s"] == 11.0
    assert not {"device_s", "process_group_s", "placement_s", "warm_up_s"} & set(rec)
    # no leader file at all: launch to first cell is still known, no phase is invented
    rec = startup_record("gloo x2", 4, 100.0, {"first_cell": 130.0}, tmp_path / "g1-a4")
    assert rec["start_s"] == 30.0 and "to_first_cell_s" not in rec and "torchrun_s" not in rec


def _imported_at_start_up(strategies: list[str]) -> set[str]:
    """Of the analysis libraries and the strategy modules, those a rank holds after its start-up
    imports for cells of ``strategies``."""
    import subprocess
    import sys

    watched = ["scipy", "pandas", "matplotlib", "strategies.fsdp", "strategies.pipeline", "strategies.ddp"]
    code = ("import sys, types, bench.train.worker as w; "
            "cell = lambda n: types.SimpleNamespace(strategy_spec=n); "
            f"w.import_for_cells(types.SimpleNamespace(cells=[cell(n) for n in {strategies!r}])); "
            f"print(','.join(m for m in {watched!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(filter(None, out.stdout.strip().split(",")))


def test_a_rank_imports_its_cells_strategies_at_start_up_and_no_analysis_library():
    """A rank imports its cells' strategy modules before its first cell starts, so that the cell
    timeout never counts an import (FSDP's module pulls in more of torch.distributed), and none of
    what only the analysis needs: scipy, pandas and matplotlib cost a CPU rank 1-2 s of every
    start-up."""
    assert _imported_at_start_up(["single", "ddp"]) == {"strategies.ddp"}
    assert _imported_at_start_up(["ddp", "fsdp"]) == {"strategies.ddp", "strategies.fsdp"}
    # an unloadable strategy is its cell's failure to report, not the start-up's
    assert _imported_at_start_up(["nowhere.module:Thing", "ddp"]) == {"strategies.ddp"}
