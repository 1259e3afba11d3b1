"""The order of a group's repeats (bench.train.rounds.rounds): a balanced Latin square from the seed."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

import pytest

from bench.core.spec import GroupPlan
from bench.train.rounds import rounds, williams


def _plan(n_cells: int, repeats: int, seed: int = 0, earlier: dict | None = None):
    cells = tuple(SimpleNamespace(cell_id=i + 1, measure=SimpleNamespace(repeats=repeats, seed=seed))
                  for i in range(n_cells))
    return GroupPlan(backend="gloo", device="cpu", n_procs=1, events_prefix="/tmp/x", pg_timeout_s=30.0,
                     trace_dir=None, cells=cells, earlier=earlier or {})


@pytest.mark.parametrize("m", [2, 3, 4, 5])
def test_every_cell_takes_every_position_and_follows_every_other_equally_often(m):
    period = len(williams(m))
    order = [[c.cell_id for c, _ in r] for r in rounds(_plan(m, period))]
    assert all(sorted(r) == list(range(1, m + 1)) for r in order)
    positions = Counter((cid, i) for r in order for i, cid in enumerate(r))
    assert set(positions.values()) == {period // m}
    after = Counter((r[i], r[i + 1]) for r in order for i in range(m - 1))
    assert len(after) == m * (m - 1) and len(set(after.values())) == 1


@pytest.mark.parametrize("m", [2, 3, 4, 5])
@pytest.mark.parametrize("seed", range(6))
def test_every_m_rounds_from_the_first_put_each_cell_in_each_position_once(m, seed):
    """Whatever the seed (it picks the first row): with --repeats 3 on 3 cells each cell runs first,
    second and last once (a newcomer's run found ddp first twice with the earlier row choice)."""
    order = [[c.cell_id for c, _ in r] for r in rounds(_plan(m, 2 * m, seed=seed))]
    for block in (order[:m], order[m:]):
        assert all(sorted(col) == list(range(1, m + 1)) for col in zip(*block)), block


def test_the_order_comes_from_the_seed_and_repeats_are_numbered():
    a, b, c = (rounds(_plan(3, 6, seed=s)) for s in (0, 0, 1))
    ids = lambda rs: [[x.cell_id for x, _ in r] for r in rs]  # noqa: E731
    assert ids(a) == ids(b) and ids(a) != ids(c)
    assert all(rep == k for k, r in enumerate(a) for _, rep in r)
    # the old per-round reshuffle gave seed 0's 3-cell group one order in rounds 2-4; no order repeats
    # within one period of the square (6 rounds for 3 cells)
    assert len({tuple(r) for r in ids(a)}) == 6


def test_one_round_keeps_the_planned_order_and_a_resumed_cell_continues_its_count():
    assert [c.cell_id for c, _ in rounds(_plan(3, 1))[0]] == [1, 2, 3]
    rs = rounds(_plan(2, 3, earlier={"1": [[0.1], [0.1]]}))  # cell 1 has 1 repeat left, cell 2 all 3
    assert [sorted((c.cell_id, k) for c, k in r) for r in rs] == [[(1, 2), (2, 0)], [(2, 1)], [(2, 2)]]
    assert rounds(_plan(2, 0)) == []
