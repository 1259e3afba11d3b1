"""The recommendations of one or more run folders as one table (an A/A pair: the same matrix twice).

    python -m tools.decisions_table RUN [RUN...] [--csv OUT.csv]

One row per run and decision (workload, backend, world size): how long the run took, whether the
workload is launch-bound, what to use, whether it is decided, the fastest candidate and its speed-up
over one device, and why, as parbench decides them from the folder now. With two runs it ends with
how many decisions named the same answer, and how many of those were decided in both.
"""

from __future__ import annotations

import argparse
import sys

import pandas as pd

from bench.decide import picks
from bench.results.run import load_run
from reports import words


def rows(path: str, run_no: int) -> list[dict]:
    run = load_run(path)
    try:
        wall = round(run.meta.took_s, 2)
    except (KeyError, TypeError, ValueError):
        wall = None
    return [{"run": run_no, "run_id": run.meta.get("run_id"), "wall_s": wall, "workload": p.workload,
             "backend": p.backend, "world_size": p.world_size, "launch_bound": p.launch_bound,
             "use": words.use_text(p), "decided": words.decided_text(p), "fastest": p.winner,
             "speedup": round(p.speedup, 3) if p.speedup is not None else None, "because": words.because_text(p)}
            for p in picks.decide(run)]


def agreement(table: pd.DataFrame) -> str:
    """'3 of 3 decisions named the same answer in both runs, 2 of them decided in both'."""
    key = ["workload", "backend", "world_size"]
    a, b = (table[table["run"] == r].set_index(key) for r in sorted(table["run"].unique())[:2])
    common = a.index.intersection(b.index)
    same = [k for k in common if a.at[k, "use"] == b.at[k, "use"] and a.at[k, "use"] != "no decision"]
    both = [k for k in same if a.at[k, "decided"] == "decided" and b.at[k, "decided"] == "decided"]
    return (f"{len(same)} of {len(common)} decisions named the same answer in both runs, {len(both)} of them "
            "decided in both")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.decisions_table", description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--csv")
    a = ap.parse_args(argv)
    table = pd.DataFrame([r for i, p in enumerate(a.runs, 1) for r in rows(p, i)])
    if table.empty:
        print("no decisions in these folders", file=sys.stderr)
        return 1
    with pd.option_context("display.width", 200, "display.max_colwidth", 60):
        print(table.drop(columns=["because", "run_id"]).to_string(index=False))
    if table["run"].nunique() > 1:
        print(agreement(table))
    if a.csv:
        table.to_csv(a.csv, index=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
