"""The knob search on real gloo processes: a budgeted run searches the batch per device and the
checkpointing of its leading strategy after the screening pass, every candidate an ordinary cell
with its one-device reference, and ends with the fastest configuration and a best.toml that plans
exactly it again."""

from __future__ import annotations

import json
import sys

import pandas as pd
import pytest

from bench.cli.run import after_run
from bench.core.config import build_config
from bench.decide import best, picks
from bench.plan import search as plan_search
from bench.plan.matrix import plan
from bench.results.run import load_run
from bench.train import launcher as launch
from bench.train import search as run_search

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

pytestmark = [pytest.mark.distributed, pytest.mark.long]


@pytest.fixture(scope="module")
def searched(tmp_path_factory):
    out = tmp_path_factory.mktemp("search")
    mp = pytest.MonkeyPatch()
    # a small space (two batches, two checkpointing values, no compile: seconds a cell on 2 cores) and
    # one final round show the mechanism; the budget only covers a loaded machine
    mp.setitem(plan_search.SPACES, "auto", plan_search.Space(ac=("none", "full"), compile=("off",), batch=(1, 2),
                                                             leaders=1, keep=2))
    mp.setattr(run_search, "MAX_ROUNDS", 1)
    cfg = build_config(toml=None, gpus=0, flags={
        "out": str(out), "device": "cpu", "backends": "gloo", "workloads": "gpt-tiny", "strategies": "ddp",
        "world_sizes": "2", "budget": "240s", "time_cap_s": 0.3, "sample_hz": 0, "adaptive": False})
    try:
        return launch.run(cfg, 0)
    finally:
        mp.undo()


def test_candidates_are_ordinary_cells_with_their_references(searched):
    meta = json.loads((searched / "meta.json").read_text())
    record = meta["search"]
    assert record["slots"] == ["gpt-tiny gloo x1", "gpt-tiny gloo x2"], record
    run = load_run(searched)
    cells = run.cells.set_index("cell_id")
    measured = best.searched(meta)
    assert measured and measured <= set(cells.index)
    ddp = cells.loc[sorted(measured)].query("strategy == 'ddp'")
    # the batch per device doubled and full checkpointing, each named in its row
    assert {(16, "none"), (8, "full"), (16, "full")} <= set(zip(ddp["global_batch"], ddp["ac"])), ddp
    ok = ddp[ddp["status"] == "ok"]
    assert len(ok) and ok["parity_ok"].fillna(False).astype(bool).all(), ok[["global_batch", "ac", "parity_ok"]]
    refs = cells[(cells["strategy"] == "single") & (cells["status"] == "ok")]
    for gb, ac in zip(ok["global_batch"], ok["ac"]):
        assert ((refs["global_batch"] == gb) & (refs["ac"] == ac)).any(), (gb, ac)  # its reference ran
    assert all(s["cap_s"] > 0 for s in record["stages"])


def test_the_strategy_decision_leaves_the_search_out(searched):
    run = load_run(searched)
    meta = json.loads((searched / "meta.json").read_text())
    assert "adaptive" not in meta or not any(set(map(int, r["cells"])) & best.searched(meta) for r in meta["adaptive"])
    (d,) = [d for d in picks.decide(run) if d.world_size == 2]
    assert d.winner == "ddp" and d.candidates == 1  # the screened ddp alone: the search's batches answer apart


def test_answer_and_best_toml_plan_it_again(searched, capsys):
    assert after_run(searched, report=False) == 0
    printed = capsys.readouterr().out
    assert "configuration to use, gpt-tiny gloo x2: ddp, compile off, checkpointing" in printed
    assert "measure it again: parbench run --config" in printed and "search (auto):" in printed
    run = load_run(searched)
    found = {b.world_size: b for b in best.answers(run)}
    assert set(found) == {1, 2}
    chosen = run.cells[run.cells["cell_id"] == found[2].cell_id].iloc[0]
    toml = tomllib.loads((searched / "best.toml").read_text())
    again = build_config(toml=toml, flags={}, gpus=0)
    cells, _, _ = plan(again, 0)
    first = max(found.values(), key=lambda b: b.throughput)
    spec = next(p.spec for p in cells if p.reason is None and p.spec.strategy == first.recipe["strategies"][0]
                and p.spec.n_devices == first.world_size)
    row = run.cells[run.cells["cell_id"] == first.cell_id].iloc[0]
    assert spec.workload.global_batch == int(row["global_batch"]) and spec.training.ac == row["ac"]
    assert again.budget.search == "off" and again.measurement.repeats == 3
    assert isinstance(chosen, pd.Series)
