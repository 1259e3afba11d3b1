"""Does a cell's step time depend on which cell ran before it in the same rank processes? (issue 10)

The harness measures a group's cells one after another in the same rank processes (one torchrun a
group), and with ``--repeats N`` it shuffles their order every round. So a run with repeats already
holds the experiment: each repeat of a cell had some predecessor (another cell, the same cell's
previous repeat, or nothing: the first cell after the group's start-up), and that predecessor was
profiled or not (the harness profiles each cell's first repeat). This reads a run folder and, per
cell, puts every repeat's median step beside its predecessor, then groups the repeats by
predecessor: if one predecessor is followed by slower repeats than the others, beyond the spread
within each group, the cells are not independent (NCCL communicators kept, the allocator's state,
what a profiler session leaves behind).

Measured first on 2 H100s (sixth stop, docs/RESULTS.md): a 1F1B cell run after DDP and FSDP cells
in the same processes was jittery (215.7 and 220.5 ms, steps 192-237 ms) in 2 of 3 rounds, and
192.6-193.2 ms when it was the first cell. `device_run.sh after` runs the experiment on a GPU.

    python3 -m bench.baselines.order_effect RUN_DIR [--strategy pipeline-1f1b] [--json]

The order is read from the steps table (each repeat's first step's wall-clock time), per process
group (cells of one world size and backend share a group). Descriptive only: with the 4-8 repeats a
device call affords, a group of 1-3 repeats has little power; the table shows each group's median, range and count, and
the verdict names a predecessor only when its whole range lies above or below every other group's
and the exact chance of that separation is at most 0.05. The drift over the run (Spearman's rho of
the repeat medians against their order) is printed beside it: a cell that slows steadily from
round to round is the machine, whichever cell came before.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

import pandas as pd

from bench.results import load_run

START = "(first in its processes)"


def repeat_table(run_dir: Path) -> pd.DataFrame:
    """One row per (cell, repeat) that ran: strategy, group key, start time, median step (s; rank 0,
    timed steps), its predecessor's strategy in the same group (``after``) and whether that
    predecessor was a profiled repeat (repeat 0, ``after_profiled``: at most once per predecessor,
    so it is shown, not grouped on)."""
    cells, steps, _ = load_run(run_dir)
    if steps is None or not len(steps):
        raise SystemExit(f"{run_dir}: no steps table; run parbench with --repeats 2 or more first")
    timed = steps[(steps["phase"] == "timed") & (steps["rank"] == 0)].dropna(subset=["step_time_s"])
    if not len(timed):
        raise SystemExit(f"{run_dir}: no timed steps of rank 0 in the steps table")
    per = timed.groupby(["cell_id", "repeat"]).agg(start=("t_unix", "min"), median_s=("step_time_s", "median"),
                                                   steps=("step_time_s", "size")).reset_index()
    info = cells.set_index("cell_id")[["strategy", "world_size", "backend"]]
    per = per.join(info, on="cell_id")
    per["group"] = per["backend"].astype(str) + " x" + per["world_size"].astype(str)
    per = per.sort_values(["group", "start"]).reset_index(drop=True)
    prev, profiled = [], []
    for _, g in per.groupby("group", sort=False):
        last = None
        for _, r in g.iterrows():
            prev.append(START if last is None else last["strategy"])
            profiled.append(last is not None and int(last["repeat"]) == 0)
            last = r
    per["after"], per["after_profiled"] = prev, profiled
    return per


def summarize(per: pd.DataFrame, strategy: str | None = None) -> list[dict]:
    """Per strategy (that ran more than once) and predecessor: repeats, median, min and max of their
    medians (ms); then per strategy the verdict and the drift over the run (Spearman's rho of the
    repeat medians against their order, and the last repeat over the first)."""
    from scipy.stats import spearmanr

    out = []
    for strat, g in per.groupby("strategy", sort=False):
        if (strategy and strat != strategy) or len(g) < 2:
            continue
        groups = {a: sorted(x["median_s"] * 1e3) for a, x in g.groupby("after", sort=False)}
        out.extend({"strategy": strat, "group": g["group"].iloc[0], "after": a, "n": len(v),
                    "median_ms": statistics.median(v), "min_ms": v[0], "max_ms": v[-1]} for a, v in groups.items())
        ordered = g.sort_values("start")["median_s"].tolist()
        rho = float(spearmanr(range(len(ordered)), ordered)[0]) if len(ordered) >= 3 else float("nan")
        out.append({"strategy": strat, "group": g["group"].iloc[0], "verdict": verdict(groups),
                    "drift": ordered[-1] / ordered[0] - 1, "drift_rho": rho})
    return out


def verdict(groups: dict[str, list[float]], alpha: float = 0.05) -> str:
    """A predecessor whose every repeat is slower (faster) than every repeat after any other one,
    named only when that separation is unlikely by chance: if the order did not matter, the k repeats
    after it would be the k slowest of all N with probability 1 / C(N, k) (the exact permutation
    p-value of complete separation; one group of 1 among 5 is 0.2, 2 among 7 is 0.048)."""
    if len(groups) < 2:
        return "one predecessor only: nothing to compare"
    n = sum(len(v) for v in groups.values())
    found = []
    for a, v in groups.items():
        others = [x for b, w in groups.items() if b != a for x in w]
        p = 1 / math.comb(n, len(v))
        if min(v) > max(others):
            found.append((p, len(v), 0, f"slower after {a}"))
        elif max(v) < min(others):
            found.append((p, len(v), 1, f"faster after {a}"))
    if not found:
        return "no predecessor apart: the groups' ranges overlap"
    # the least likely separation; on a tie (two groups: one is slower exactly when the other is
    # faster) the smaller group, the more specific predecessor, and "slower" first
    p, _, _, text = min(found)
    if p > alpha:
        return f"{text}, but that separation has p = {p:.2g} by chance (too few repeats)"
    return f"{text} (every repeat beyond every other group; p = {p:.2g})"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--strategy", help="only this strategy (default: every one that ran twice or more)")
    ap.add_argument("--json", action="store_true", help="print the rows as one JSON line last")
    a = ap.parse_args(argv)
    if not (a.run_dir / "meta.json").exists():
        print(f"order_effect: {a.run_dir} is not a run folder (no meta.json); pass the folder parbench run "
              "wrote", file=sys.stderr)
        return 2
    per = repeat_table(a.run_dir)
    pd.set_option("display.width", 200)
    show = per.assign(median_ms=(per["median_s"] * 1e3).round(2))[["group", "strategy", "repeat", "after",
                                                                   "after_profiled", "median_ms", "steps"]]
    print(show.to_string(index=False))
    print()
    rows = summarize(per, a.strategy)
    for r in rows:
        if "verdict" in r:
            print(f"{r['strategy']} ({r['group']}): {r['verdict']}; drift over the run {r['drift']:+.1%} "
                  f"(last repeat / first), Spearman rho {r['drift_rho']:.2f} against the order")
        else:
            print(f"  {r['strategy']:>16} after {r['after']:<28} n={r['n']}  median {r['median_ms']:.2f} ms "
                  f"[{r['min_ms']:.2f}, {r['max_ms']:.2f}]")
    if a.json:
        print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
