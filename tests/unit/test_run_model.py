"""The Run read model: a folder read once, every upgrade of an older folder in one module, the views
its readers share."""

from __future__ import annotations

import pandas as pd
import pytest

from bench.core.errors import UserError
from bench.results.migrate import STEPS, upgrade
from bench.results.run import Run, load_run
from tests.regress_helpers import write_run


def _row(**over):
    base = dict(cell_id=0, mode="train", workload="w", strategy="single", backend="gloo", device="cpu", world_size=1,
                status="ok", role="reference", optimizer="adamw", compile="off", ac="none", repeats=3, repeats_done=3)
    return {**base, **over}


def test_a_folder_of_this_version_needs_no_upgrade(tmp_path):
    knobs = dict(mode="train", optimizer="adamw", compile="off", ac="none", role="")
    run = load_run(write_run(tmp_path / "r", {"ddp": 1.0, "fsdp": 1.0}, **knobs))
    assert run.upgraded == ()
    old = load_run(write_run(tmp_path / "old", {"ddp": 1.0, "single": 1.0}))  # no knobs, no role columns
    assert old.upgraded == ("training knobs of runs before them", "role from the strategy's declaration")
    assert old.cells.set_index("strategy")["role"].to_dict() == {"ddp": "", "single": "reference"}
    cells, steps, meta = run  # unpacks as the tuple readers and scripts use
    assert cells is run.cells and steps is run.steps and meta is run.meta
    assert load_run(run) is run  # a Run passes through


@pytest.mark.parametrize("name, before, check", [
    ("serve status error -> failed", dict(mode="serve", status="error", strategy="replicas", role=None),
     lambda c: c.loc[0, "status"] == "failed"),
    ("training knobs of runs before them", dict(optimizer=None, compile=None, ac=None),
     lambda c: list(c.loc[0, ["optimizer", "compile", "ac"]]) == ["sgd", "off", "none"]),
    ("role from the strategy's declaration", dict(role=None), lambda c: c.loc[0, "role"] == "reference"),
    ("repeats_done of runs before it", dict(repeats_done=None), lambda c: c.loc[0, "repeats_done"] == 3),
])
def test_each_upgrade_step_fills_in_what_an_older_version_left_out(name, before, check):
    assert name in [n for n, _ in STEPS]
    cells, done = upgrade(pd.DataFrame([_row(**before)]))
    assert name in done and check(cells)
    again, more = upgrade(cells)
    assert more == () and again.equals(cells)  # an upgraded frame is this version's


def test_views_split_training_serving_and_what_ran():
    cells = pd.DataFrame([_row(), _row(cell_id=1, mode=None, strategy="ddp", role="", world_size=2),
                          _row(cell_id=2, mode="serve", strategy="replicas", role=None),
                          _row(cell_id=3, strategy="ddp", world_size=4, status="skipped", role="")])
    run = Run.from_frames(cells)
    assert run.training["cell_id"].tolist() == [0, 1, 3]  # no mode is a training row
    assert run.serving["cell_id"].tolist() == [2]
    assert run.ran["cell_id"].tolist() == [0, 1, 2]
    assert run.table("samples").empty and not run.has_table("samples")  # not on disk: nothing to read


def test_a_row_without_a_status_is_refused_in_one_line():
    with pytest.raises(UserError, match="have no status"):
        Run.from_frames(pd.DataFrame([_row(status=None)]))
