"""The typed contracts survive the process boundary and refuse what does not match them."""

import pytest

from bench.core import spec
from bench.core.spec import ContractError, GroupPlan, Measured, RankMeasurement
from tests.unit.test_rows import spec as cell


def test_group_plan_round_trips():
    plan = GroupPlan(backend="gloo", device="cpu", n_procs=2, events_prefix="/tmp/x", pg_timeout_s=30.0,
                     trace_dir=None, cells=(cell(), cell(n=4)),
                     earlier={"7": [[0.1, 0.2], [0.15]]}, settled={"7": 12}, held={"7": 0.12})
    back = spec.load(GroupPlan, spec.dump(plan))
    assert back == plan and isinstance(back.cells, tuple) and back.cells[0].devices == (0, 1)
    assert back.first_repeat(7) == 2 and back.first_repeat(8) == 0


def test_events_round_trip_with_rank_measurements():
    ev = Measured(cell_id=3, wall_s=1.5, t=0.0, ranks=[RankMeasurement(rank=0, times=[0.1], window=(1.0, 2.0))])
    back = spec.load_event(spec.dump(ev))
    assert back == ev and back.ranks[0].window == (1.0, 2.0)


@pytest.mark.parametrize("mutate, needle", [
    (lambda d: d.pop("backend"), "missing field 'backend'"),
    (lambda d: d.update(n_procs="2"), "n_procs: expected an integer"),
    (lambda d: d["cells"][0].update(colour=1), "unknown field"),
    (lambda d: d["cells"][0]["measure"].update(steps=True), "steps: expected an integer"),
])
def test_a_plan_that_breaks_the_contract_is_refused_naming_the_field(mutate, needle):
    import json

    plan = GroupPlan(backend="gloo", device="cpu", n_procs=2, events_prefix="/tmp/x", pg_timeout_s=30.0,
                     trace_dir=None, cells=(cell(),))
    d = json.loads(spec.dump(plan))
    mutate(d)
    with pytest.raises(ContractError, match=needle):
        spec.load(GroupPlan, d)


def test_unknown_event_kind():
    with pytest.raises(ContractError, match="event 'bogus' unknown"):
        spec.load_event('{"event": "bogus"}')
