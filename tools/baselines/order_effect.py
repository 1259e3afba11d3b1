"""Does a cell's step time depend on which cell ran before it in the same rank processes?

The harness measures a group's cells one after another in the same rank processes (one torchrun a
group), and with ``--repeats N`` it orders each round by a row of a balanced Latin square (each cell
after each other cell equally often over the rounds). So a run with repeats already holds the
experiment: each repeat of a cell had some predecessor (another cell, the same cell's
previous repeat, or nothing: the first cell after the group's start-up), and that predecessor was
profiled or not (the harness profiles each cell's first repeat: with GPU activity under
``--profile-at inline``, on the CPU side only when the GPU-profiled steps wait for the profile
pass). This reads a run folder and, per
cell, puts every repeat's median step beside its predecessor, then groups the repeats by
predecessor: if one predecessor is followed by slower repeats than the others, beyond the spread
within each group, the cells are not independent (NCCL communicators kept, the allocator's state,
what a profiler session leaves behind).

Why ask: on 2 H100s a 1F1B cell run after DDP and FSDP cells in the same processes has been
jittery (215.7 and 220.5 ms, steps 192-237 ms) in 2 of 3 rounds, against 192.6-193.2 ms as the
first cell (docs/RESULTS.md). `device_run.sh after` runs the experiment on a GPU.

    python3 -m tools.baselines.order_effect RUN_DIR [--strategy pipeline-1f1b] [--json]

The order is read from the steps table (each repeat's first step's wall-clock time), per process
group (cells of one world size and backend share a group). Descriptive only: with the 4-8 repeats a
device call affords, a group of 1-3 repeats has little power; the table shows each group's median, range and count, and
the verdict names a predecessor only when its whole range lies above or below every other group's
and the chance that some group separates that way when the order does not matter (a seeded
permutation count over every group and both directions) is at most 0.05. The drift over the run (Spearman's rho of
the repeat medians against their order) is printed beside it: a cell that slows steadily from
round to round is the machine, whichever cell came before. One limit: a group relaunched after a
timeout or a crash starts new processes, which the steps table does not mark, so the first cell
after a relaunch is shown after the cell before the relaunch (the run's notes in meta.json
``survivors`` say when that happened). And the harness balances predecessors within rounds; the
first cell of a round follows the last of the previous one, which is not balanced.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from bench.results.run import load_run

START = "(first in its processes)"


def repeat_table(run_dir: Path) -> pd.DataFrame:
    """One row per (cell, repeat) that ran: its cell label, process group (the launcher's key: ranks,
    nodes, backend), start time, median step (s; rank 0, timed steps), the label of the cell that
    ran before it in the same group (``after``) and whether that one was a profiled repeat (repeat
    0, ``after_profiled``: at most once per predecessor, so it is shown, not grouped on)."""
    cells, steps, _ = load_run(run_dir)
    if steps is None or not len(steps):
        raise SystemExit(f"{run_dir}: no steps table; run parbench with --repeats 2 or more first")
    timed = steps[(steps["phase"] == "timed") & (steps["rank"] == 0)].dropna(subset=["step_time_s"])
    if not len(timed):
        raise SystemExit(f"{run_dir}: no timed steps of rank 0 in the steps table")
    per = timed.groupby(["cell_id", "repeat"]).agg(start=("t_unix", "min"), median_s=("step_time_s", "median"),
                                                   steps=("step_time_s", "size")).reset_index()
    c = cells.set_index("cell_id")
    nproc = c["nproc"] if "nproc" in c else c["world_size"]
    nnodes = c["nnodes"] if "nnodes" in c else pd.Series(1, index=c.index)
    several = c["workload"].nunique() > 1
    label = c["strategy"].astype(str) + " x" + c["world_size"].astype(str) + (
        " " + c["workload"].astype(str) if several else "")
    group = c["backend"].astype(str) + ", " + nproc.astype(str) + " proc" + (
        nnodes.map(lambda n: f", {n} nodes" if n and n > 1 else ""))
    per["label"], per["group"] = per["cell_id"].map(label), per["cell_id"].map(group)
    per = per.sort_values(["group", "start"]).reset_index(drop=True)
    prev, profiled = [], []
    for _, g in per.groupby("group", sort=False):
        last = None
        for _, r in g.iterrows():
            prev.append(START if last is None else last["label"])
            profiled.append(last is not None and int(last["repeat"]) == 0)
            last = r
    per["after"], per["after_profiled"] = prev, profiled
    return per


def summarize(per: pd.DataFrame, strategy: str | None = None, *, seed: int = 0) -> list[dict]:
    """Per cell (that ran more than once) and predecessor: repeats, median, min and max of their
    medians (ms); then per cell the verdict and the drift over the run (Spearman's rho of the repeat
    medians against their order, and the last repeat over the first). ``strategy``: only cells whose
    label starts with it."""
    from scipy.stats import spearmanr

    out = []
    for _, g in per.groupby("cell_id", sort=True):
        lab = g["label"].iloc[0]
        if (strategy and not lab.startswith(strategy + " ")) or len(g) < 2:
            continue
        groups = {a: sorted(x["median_s"] * 1e3) for a, x in g.groupby("after", sort=False)}
        out.extend({"cell": lab, "group": g["group"].iloc[0], "after": a, "n": len(v),
                    "median_ms": statistics.median(v), "min_ms": v[0], "max_ms": v[-1]} for a, v in groups.items())
        ordered = g.sort_values("start")["median_s"].tolist()
        rho = float(spearmanr(range(len(ordered)), ordered)[0]) if len(ordered) >= 3 else float("nan")
        out.append({"cell": lab, "group": g["group"].iloc[0], "verdict": verdict(groups, seed=seed),
                    "drift": ordered[-1] / ordered[0] - 1, "drift_rho": rho})
    return out


def separated(groups: list[list[float]]) -> list[tuple[int, str]]:
    """(group index, 'slower' or 'faster') for each group whose every value lies above (below) every
    value of the other groups."""
    found = []
    for i, v in enumerate(groups):
        others = [x for j, w in enumerate(groups) if j != i for x in w]
        if min(v) > max(others):
            found.append((i, "slower"))
        elif max(v) < min(others):
            found.append((i, "faster"))
    return found


def chance(sizes: list[int], draws: int = 20000, seed: int = 0) -> float:
    """The chance, if the order did not matter, that some group (any of them, either way) is
    completely separated from the rest: the labels of the N repeats shuffled ``draws`` times (seeded,
    so a verdict is reproducible). This is the p-value of the verdict below; the one-group,
    one-direction chance 1 / C(N, k) would understate it, since every group and both directions are
    tried (it gives 10-22% false alarms for 2-3 groups of 2-5)."""
    rng = np.random.default_rng(seed)
    labels = np.repeat(np.arange(len(sizes)), sizes)
    n = len(labels)
    perms = labels[np.argsort(rng.random((draws, n)), axis=1)]  # one shuffled order a row
    hit = np.zeros(draws, dtype=bool)
    for g, k in enumerate(sizes):  # group g holds the k lowest or the k highest ranks
        hit |= (perms[:, :k] == g).all(axis=1) | (perms[:, n - k:] == g).all(axis=1)
    return (int(hit.sum()) + 1) / (draws + 1)


def verdict(groups: dict[str, list[float]], alpha: float = 0.05, seed: int = 0) -> str:
    """A predecessor whose every repeat is slower (faster) than every repeat after any other one,
    named only when such a separation of some group is unlikely by chance (:func:`chance`)."""
    if len(groups) < 2:
        return "one predecessor only: nothing to compare"
    names, values = list(groups), list(groups.values())
    found = separated(values)
    if not found:
        return "no predecessor apart: the groups' ranges overlap"
    p = chance([len(v) for v in values], seed=seed)
    # the more specific (smaller) group first; on a tie (two groups: one is slower exactly when the
    # other is faster) "slower" first
    i, way = min(found, key=lambda f: (len(values[f[0]]), f[1] != "slower"))
    text = f"{way} after {names[i]}"
    if p > alpha:
        return f"{text}, but some group separates that way by chance with p = {p:.2g} (too few repeats)"
    return f"{text} (every repeat beyond every other group; permutation p = {p:.2g})"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--strategy", help="only this strategy's cells (default: every cell that ran twice or more)")
    ap.add_argument("--json", action="store_true", help="print the rows as one JSON line last")
    a = ap.parse_args(argv)
    if not (a.run_dir / "meta.json").exists():
        print(f"order_effect: {a.run_dir} is not a run folder (no meta.json); pass the folder parbench run "
              "wrote", file=sys.stderr)
        return 2
    per = repeat_table(a.run_dir)
    pd.set_option("display.width", 200)
    show = per.assign(median_ms=(per["median_s"] * 1e3).round(2))[["group", "label", "repeat", "after",
                                                                   "after_profiled", "median_ms", "steps"]]
    print(show.to_string(index=False))
    print()
    rows = summarize(per, a.strategy)
    for r in rows:
        if "verdict" in r:
            print(f"{r['cell']} ({r['group']}): {r['verdict']}; drift over the run {r['drift']:+.1%} "
                  f"(last repeat / first), Spearman rho {r['drift_rho']:.2f} against the order")
        else:
            print(f"  {r['cell']:>20} after {r['after']:<28} n={r['n']}  median {r['median_ms']:.2f} ms "
                  f"[{r['min_ms']:.2f}, {r['max_ms']:.2f}]")
    if a.json:
        print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
