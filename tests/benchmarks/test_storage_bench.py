"""Append-only storage at scale: 1,000 cells with 1,000,000 telemetry samples written and read back.

As a real benchmark (``pytest tests/benchmarks --benchmark-enable``) at full scale: time and peak
memory are printed, and the test fails if appending gets slower as the run grows (a cell's write
must not depend on how many came before). Under the suite's default ``--benchmark-disable`` it runs
once at a tenth of the cells and samples and checks what is written, not how long it took: every
cell is appended as parts of its own, none rewritten, and compaction leaves one part a table."""

from __future__ import annotations

import resource
import time

import pytest

from bench.results.columns import all_metrics
from bench.results.run import load_run
from bench.results.store import RunWriter, cell_columns, read_table

N_CELLS, SAMPLES_PER_CELL, STEPS_PER_CELL = 1000, 1000, 20
#: the scale with benchmarks disabled (the default suite): what is written, not how fast
SMALL_CELLS, SMALL_SAMPLES = 100, 100


def write_run(path, n_cells: int = N_CELLS, samples_per_cell: int = SAMPLES_PER_CELL) -> list[float]:
    w = RunWriter(path, cell_schema=cell_columns(all_metrics()))
    per_cell = []
    for c in range(n_cells):
        t0 = time.perf_counter()
        w.add({"cell_id": c, "workload": "w", "strategy": "ddp", "backend": "gloo", "device": "cpu",
               "world_size": 1 if c == 0 else 2, "global_batch": 8, "step_time_ci_low_s": 0.0099,
               "step_time_ci_high_s": 0.0101, "timed_start_unix": float(c), "timed_end_unix": c + 0.9,
               "status": "ok", "role": "reference" if c == 0 else "", "precision": "fp32",
               "throughput_samples_s": 100.0, "step_time_median_s": 0.01},
              [{"cell_id": c, "rank": r, "step": s, "phase": "timed", "step_time_s": 0.01, "loss": 1.0,
                "loss_weight": 0.5} for r in range(2) for s in range(STEPS_PER_CELL // 2)])
        w.append("samples", [{"host": "h", "device": "gpu0", "t": c + i / samples_per_cell, "metric": "power_w",
                              "value": 1.0} for i in range(samples_per_cell)])
        per_cell.append(time.perf_counter() - t0)
    return per_cell


@pytest.mark.benchmark(group="storage")
def test_thousand_cells_and_a_million_samples(benchmark, tmp_path, capsys):
    runs = iter(range(10**6))
    n_cells, n_samples = (SMALL_CELLS, SMALL_SAMPLES) if benchmark.disabled else (N_CELLS, SAMPLES_PER_CELL)
    parts: dict[str, int] = {}

    def once():
        d = tmp_path / f"run{next(runs)}"
        t0 = time.perf_counter()
        per_cell = write_run(d, n_cells, n_samples)
        t_write = time.perf_counter() - t0
        parts.update({t: len(list((d / f"{t}.parquet").glob("part-*.parquet"))) for t in ("cells", "samples")})
        t1 = time.perf_counter()
        cells, steps, _ = load_run(d)
        samples = read_table(d, "samples")
        t_read = time.perf_counter() - t1
        t2 = time.perf_counter()
        RunWriter(d, resume=True).compact()  # what the end of a run does
        t_compact = time.perf_counter() - t2
        t3 = time.perf_counter()
        cells2, _, _ = load_run(d)
        assert len(cells2) == len(cells) and len(read_table(d, "samples")) == len(samples)
        parts.update({f"{t}-compacted": len(list((d / f"{t}.parquet").glob("part-*.parquet")))
                      for t in ("cells", "samples")})
        t_read_compacted = time.perf_counter() - t3
        return per_cell, t_write, t_read, cells, steps, samples, t_compact, t_read_compacted

    per_cell, t_write, t_read, cells, steps, samples, t_compact, t_read2 = benchmark.pedantic(
        once, rounds=1, iterations=1)
    assert len(cells) == n_cells and len(steps) == n_cells * STEPS_PER_CELL
    assert len(samples) == n_cells * n_samples
    # append-only: a part per cell and table, none rewritten; compaction leaves one a table
    assert parts == {"cells": n_cells, "samples": n_cells, "cells-compacted": 1, "samples-compacted": 1}, parts
    first, last = sum(per_cell[:100]), sum(per_cell[-100:])
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if benchmark.disabled:
        return
    with capsys.disabled():
        print(f"\nstorage: wrote {N_CELLS} cells + {len(samples):,} samples in {t_write:.2f} s "
              f"(first 100 cells {first:.2f} s, last 100 {last:.2f} s), read back in {t_read:.2f} s; "
              f"compacted in {t_compact:.2f} s, read back in {t_read2:.2f} s; peak RSS {peak_mib:.0f} MiB")
    benchmark.extra_info.update(write_s=t_write, read_s=t_read, first100_s=first, last100_s=last,
                                peak_rss_mib=peak_mib)
    # Linear growth: the last hundred cells cost about what the first hundred did (rewriting whole
    # tables, as before, made this ratio grow with the run).
    assert last < 2.5 * first, (first, last)
