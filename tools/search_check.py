"""The knob search's answer against an exhaustive grid over the same knobs.

    python -m tools.search_check DEFAULT GRID [GRID...] [--csv OUT.csv] [--json OUT.json]

DEFAULT is the run folder (or its copy: meta.json and cells.parquet) of a run that searched; each
GRID one that measured the grid (tools/device/search.sh). The answer's configuration (compile,
checkpointing, global batch) is looked up in the grid, and its grid throughput is set against the
grid's fastest: the ratio, and the pair's verdict from the grid's own repeats. The table lists every
grid cell; the summary is printed last.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

from bench.decide import best
from bench.decide.rules import judge_pair
from bench.results.run import Run

KEY = ["compile", "ac", "global_batch"]


def folder(path: str) -> Run:
    d = Path(path)
    d = d if (d / "meta.json").is_file() else sorted(p for p in d.iterdir() if (p / "meta.json").is_file())[-1]
    cells = pd.read_parquet(d / "cells.parquet") if (d / "cells.parquet").is_file() else pd.read_csv(d / "cells.csv")
    return Run(cells, meta=json.loads((d / "meta.json").read_text()), path=d)


def check(default: Run, grids: list[Run]) -> tuple[pd.DataFrame, dict]:
    """(the grid's cells with the answer and the fastest marked, the summary)."""
    found = [b for b in best.answers(default) if b.world_size == 1]
    if not found:
        raise SystemExit("the default run has no one-device answer from a search")
    b = found[0]
    chosen = default.cells[default.cells["cell_id"] == b.cell_id].iloc[0]
    grid = pd.concat([g.training.assign(grid_run=g.path.name) for g in grids], ignore_index=True)
    ok = grid[grid["status"] == "ok"].sort_values("throughput_samples_s", ascending=False)
    fastest = ok.iloc[0]
    same = ok[(ok[KEY].astype(str) == chosen[KEY].astype(str).to_numpy()).all(axis=1)]
    wanted = ["grid_run", "cell_id", *KEY, "status", "step_time_median_s", "step_time_ci_low_s", "step_time_ci_high_s",
              "throughput_samples_s", "repeats_done", "peak_mem_bytes", "compile_s", "reason"]
    table = grid[[c for c in wanted if c in grid]].copy()
    table["answer"] = (table[KEY].astype(str) == chosen[KEY].astype(str).to_numpy()).all(axis=1)
    table["grid_fastest"] = table.index == fastest.name
    summary = {"answer": b.config, "answer_cell_in_default": b.cell_id,
               "answer_in_default_samples_s": round(b.throughput, 2),
               "grid_fastest": best.configuration(fastest), "grid_fastest_samples_s": round(float(
                   fastest["throughput_samples_s"]), 2), "grid_cells": int(len(grid)), "grid_ok": int(len(ok))}
    if len(same):
        g = same.iloc[0]
        summary["answer_in_grid_samples_s"] = round(float(g["throughput_samples_s"]), 2)
        summary["answer_over_fastest"] = round(float(g["throughput_samples_s"] / fastest["throughput_samples_s"]), 4)
        summary["fastest_vs_answer"] = str(judge_pair(fastest, g).state) if g.name != fastest.name else "the same cell"
    else:
        summary["answer_in_grid_samples_s"] = None
    return table, summary


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("default")
    ap.add_argument("grids", nargs="+")
    ap.add_argument("--csv")
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    table, summary = check(folder(a.default), [folder(g) for g in a.grids])
    if a.csv:
        table.to_csv(a.csv, index=False)
    if a.json:
        Path(a.json).write_text(json.dumps(summary, indent=1) + "\n")
    print(table.drop(columns=["reason"], errors="ignore").to_string(index=False))
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
