"""The order of a group's repeats: rounds of cells, ordered by a balanced Latin square from the seed."""

from __future__ import annotations

import random

from bench.core.spec import CellSpec, GroupPlan


def williams(m: int) -> list[list[int]]:
    """The rows of a balanced Latin square (Williams, 1949) on ``m`` items: over the rows each item
    takes each position equally often and follows each other item equally often (m rows for even
    m; for odd m the square and its mirror, 2m rows)."""
    if m <= 1:
        return [[0] * m]
    first, lo, hi = [0], 1, m - 1
    for i in range(1, m):
        if i % 2:
            first.append(lo)
            lo += 1
        else:
            first.append(hi)
            hi -= 1
    rows = [[(x + k) % m for x in first] for k in range(m)]
    return rows + [r[::-1] for r in rows] if m % 2 else rows


def rounds(plan: GroupPlan) -> list[list[tuple[CellSpec, int]]]:
    """The group's measurements as rounds: round k measures every cell that still has a repeat
    left. With several rounds their orders are the rows of a balanced Latin square (:func:`williams`)
    on the group's m cells, the cells' places in it and the first row drawn from the seed: every m
    rounds (from the first) put every cell in every position once, and every m rounds (even m) or
    2m rounds (odd m) put every cell after every other cell equally often, so slow drift of the
    machine and whatever a cell leaves behind in the processes land on every cell alike (a fresh
    shuffle per round does not: with seed 0 it runs a 3-cell group in one order in rounds 2-4, its
    middle cell never first or last). Fewer rounds than cells cannot balance positions. The balance
    counts neighbours within a round: the last cell of one round and the first of the next are not
    balanced (with 2 cells, A B / B A, a cell follows itself there). A relaunch (after a crash or a
    timeout) starts a new square on the cells left, so the claims hold per launch. A single round
    keeps the planned order (the reference first)."""
    start = {c.cell_id: plan.first_repeat(c.cell_id) for c in plan.cells}
    left = {c.cell_id: c.measure.repeats - start[c.cell_id] for c in plan.cells}
    n = max(left.values(), default=0)
    if n <= 1:
        return [[(c, start[c.cell_id]) for c in plan.cells if left[c.cell_id] > 0]] if n else []
    rng = random.Random((plan.cells[0].measure.seed if plan.cells else 0) * 7919 + 17)
    cells = list(plan.cells)
    symbol = dict(zip((c.cell_id for c in cells), rng.sample(range(len(cells)), len(cells))))
    m = len(cells)
    rows = williams(m)
    offset = rng.randrange(m)
    out = []
    for k in range(n):
        # rounds k..k+m-1 from 0 are m rows of one square (odd m: the square, then its mirror), so
        # every m rounds from the first give each cell each position once, whatever the offset
        row = rows[((k // m) % (len(rows) // m)) * m + (offset + k) % m]
        place = {sym: i for i, sym in enumerate(row)}
        todo = sorted((c for c in cells if left[c.cell_id] > k), key=lambda c: place[symbol[c.cell_id]])
        out.append([(c, start[c.cell_id] + k) for c in todo])
    return out
