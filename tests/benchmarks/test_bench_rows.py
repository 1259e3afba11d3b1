"""Microbenchmark of the one row builder: a cell of 8 ranks x 5 repeats x 200 steps."""

from __future__ import annotations

import pytest

from bench.results.rows import build_row
from tests.unit.test_rows import rank, spec


@pytest.mark.benchmark(group="rows")
def test_build_row_of_a_large_cell(benchmark):
    cell = spec(n=8, steps=200)
    repeats = [[rank(r, [0.1 + 0.001 * ((s * 7 + r + k) % 13) for s in range(200)]) for r in range(8)]
               for k in range(5)]
    row, steps, _ = benchmark(build_row, cell, repeats, wall_s=100.0)
    assert row["status"] == "ok" and row["repeats_done"] == 5 and len(steps) == 5 * 8 * 201
