"""The search's answers of one or more run folders as one table (an A/A pair: the same matrix twice).

    python -m tools.search_table RUN [RUN...] [--csv OUT.csv]

One row per run and slot: the configuration to use, its samples a second and repeats, its margin
over what the answer starts from (the library default at its defaults unless a strategy beats it:
bench.decide.best) and the verdict, the runner-up's verdict, and whether the answer is decided
(every margin judged beyond the noise or the same speed). With two runs it ends with how many slots
named the same configuration, and how many of those were decided in both.
"""

from __future__ import annotations

import argparse
import sys

import pandas as pd

from bench.decide import best
from bench.results.run import load_run


def rows(path: str, run_no: int) -> list[dict]:
    run = load_run(path)
    out = []
    for b in best.answers(run):
        out.append({"run": run_no, "slot": b.title, "answer": b.config, "samples_s": round(b.throughput, 1),
                    "repeats": b.repeats, "vs_defaults": round(b.baseline.ratio, 3) if b.baseline else None,
                    "vs_defaults_verdict": b.baseline.verdict if b.baseline else None,
                    "runner_up_verdict": b.runner_up.verdict if b.runner_up else None, "decided": b.decided})
    return out


def agreement(table: pd.DataFrame) -> str:
    """'4 of 6 slots named the same configuration in both runs, 2 of them decided in both'."""
    a, b = (table[table["run"] == r].set_index("slot") for r in sorted(table["run"].unique())[:2])
    common = a.index.intersection(b.index)
    same = [s for s in common if a.at[s, "answer"] == b.at[s, "answer"]]
    decided = [s for s in same if a.at[s, "decided"] and b.at[s, "decided"]]
    flipped = [s for s in common if s not in same and a.at[s, "decided"] and b.at[s, "decided"]]
    return (f"{len(same)} of {len(common)} slots named the same configuration in both runs, {len(decided)} of them "
            f"decided in both; {len(flipped)} slots decided differently in the two")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--csv")
    a = ap.parse_args(argv)
    table = pd.DataFrame([r for i, p in enumerate(a.runs, 1) for r in rows(p, i)])
    if a.csv:
        table.to_csv(a.csv, index=False)
    print(table.to_string(index=False))
    if table["run"].nunique() >= 2:
        print(agreement(table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
