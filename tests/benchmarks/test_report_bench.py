"""The report of a large run (1,000 cells, 1,000,000 telemetry samples) builds in at most 15 s, as a
real benchmark (``--benchmark-enable``). Under the suite's default ``--benchmark-disable`` it builds
the report of a tenth of the cells and samples once, and checks the page, not the time."""

from __future__ import annotations

import time

import pytest

from reports import build_report
from tests.benchmarks.test_storage_bench import SMALL_CELLS, SMALL_SAMPLES, write_run

LIMIT_S = 15.0


@pytest.mark.benchmark(group="report")
def test_report_of_a_thousand_cells(benchmark, tmp_path_factory, capsys):
    from bench.results.store import RunWriter

    run = tmp_path_factory.mktemp("big") / "run"
    if benchmark.disabled:
        write_run(run, SMALL_CELLS, SMALL_SAMPLES)
    else:
        write_run(run)
    RunWriter(run, resume=True).compact()  # as the end of `parbench run` leaves it
    outs = iter(range(100))

    def once():
        t0 = time.perf_counter()
        page = build_report(run, run / f"report{next(outs)}")
        return page, time.perf_counter() - t0

    page, took = benchmark.pedantic(once, rounds=1, iterations=1)
    assert page.is_file() and page.stat().st_size > 0
    if benchmark.disabled:
        return
    with capsys.disabled():
        print(f"\nreport: 1000 cells, 1,000,000 samples built in {took:.1f} s ({page.stat().st_size / 1e6:.1f} MB)")
    benchmark.extra_info["build_s"] = took
    assert took <= LIMIT_S, took
