"""Calibrate the regression gate: how often an A/A pair fails, how often a 5% slowdown is caught.

Every pair is judged by ``regress.compare`` with the defaults ``parbench compare`` ships (read from
its parser: ``require_repeats`` on, the Mann-Whitney test, alpha 0.02), so the rates are those of
the gate as a user runs it; the rates under ``--single-run`` (one run's steps a side may decide)
are reported beside them, labelled so. Two sources of pairs:

* synthetic: per-step times resampled from real recorded distributions (``--runs``: the timed steps of
  recorded GPU runs, ``RUNS/*/steps.parquet``),
  so the pair is A/A by construction (or A/B with a known multiplicative slowdown);
* real: small CPU runs of this machine, each run holding the plain strategy and the same strategy
  wrapped in ``tests.regress_helpers:Slow5`` (+5% of its own step time, spun, not slept).

``python -m tools.calibrate --runs results --runs-total 30 --out /tmp/cal`` makes the runs, forms the real pairs
(with and without runs pooled as repeats) and prints both rates; docs/guides/regression-gate.md
explains the rule they measure.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Iterable
from functools import cache
from pathlib import Path

import numpy as np
import pandas as pd

from bench.core.errors import UserError
from bench.gate.compare import Gate, Side, compare, parse_threshold
from bench.gate.samples import step_times
from bench.runtime.process import child_env, run_tree

#: wrapped strategy name -> the strategy it slows down (the cell it is compared with)
SLOW = {"slow5": "single", "slow5-ddp": "ddp"}
#: the strategy -> the class in tests/regress_helpers.py that slows it down
SLOW_CLASS = {"single": "Slow5", "ddp": "Slow5DDP"}


def real_distributions(paths: Iterable[Path], min_steps: int = 10) -> list[np.ndarray]:
    """The per-step times (slowest rank) of every cell with >= min_steps timed steps."""
    out = []
    for p in paths:
        st = step_times(pd.read_parquet(p))
        for _, g in st.groupby("cell_id"):
            if len(g) >= min_steps:
                out.append(g["step_time_s"].to_numpy(float))
    if not out:
        raise UserError("no recorded step times to calibrate on; pass runs with steps.parquet")
    return out


@cache
def _defaults() -> tuple:
    from bench.cli.gate import register

    p = argparse.ArgumentParser()
    register(p.add_subparsers())
    a = p.parse_args(["compare", "BASE", "CURRENT"])
    from bench.gate.verdict import DEFAULT_THRESHOLD

    return a.require_repeats, a.test, parse_threshold(a.threshold or DEFAULT_THRESHOLD)


def shipped_defaults() -> dict[str, object]:
    """The options ``parbench compare BASE CURRENT`` runs with when given none, taken from its own
    parser (bench/cli/gate.py) and, for the threshold, the default it falls back to
    (bench/gate/verdict.py), so the calibration follows the CLI if a default changes."""
    require_repeats, test, threshold = _defaults()
    return dict(require_repeats=require_repeats, test=test, threshold=threshold)


def gate(base: tuple, cur: tuple, threshold: float, single_run: bool = False,
         base_samples: dict | None = None) -> pd.DataFrame:
    """``compare`` of two (cells, steps, meta) runs as ``parbench compare`` does it by default, or
    with ``--single-run`` when ``single_run``; ``base_samples`` (a history's per-run medians) stand
    in for BASE's steps."""
    d = shipped_defaults()
    rule = Gate(threshold=threshold, test=d["test"], require_repeats=bool(d["require_repeats"]) and not single_run)
    return compare(Side(*base, samples=base_samples), Side(*cur), rule)


def _synthetic_run(draws: list[list[np.ndarray]]) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    """A run (cells, steps, meta) with one cell per trial: ``draws[i]`` holds the step times of each
    repeat of cell i (one array: a run without repeats)."""
    from bench.results.store import CELL_COLUMNS, STEP_COLUMNS, frame

    cells, cols = [], {"cell_id": [], "repeat": [], "step": [], "step_time_s": []}
    for i, reps in enumerate(draws):
        cells.append(dict(cell_id=i, workload="calibrate", strategy=f"trial{i}", backend="-", device="gpu",
                          world_size=1, status="ok", throughput_samples_s=1 / float(np.median(np.concatenate(reps)))))
        for r, x in enumerate(reps):
            cols["cell_id"] += [i] * len(x)
            cols["repeat"] += [r] * len(x)
            cols["step"] += list(range(len(x)))
            cols["step_time_s"] += x.tolist()
    steps = frame(pd.DataFrame({**cols, "rank": 0, "phase": "timed"}), STEP_COLUMNS)
    if all(len(reps) == 1 for reps in draws):
        steps = steps.drop(columns="repeat")
    return frame(cells, CELL_COLUMNS), steps, {}


def synthetic_trials(dists: list[np.ndarray], trials: int, slowdown: float, repeats: int = 1,
                     threshold: float = 0.05, seed: int = 0, single_run: bool = False) -> pd.DataFrame:
    """One row per trial (cells taken in turn): the verdict of ``parbench compare`` with its default
    options on BASE vs CURRENT = BASE's distribution * (1 + slowdown), each side ``repeats``
    repeats of len(d) steps resampled from the recorded cell. All trials go through one
    ``compare`` call (one cell per trial), the path the CLI takes. ``single_run`` adds the verdict
    under ``--single-run`` as ``verdict_single_run``."""
    rng = np.random.default_rng(seed)
    base, cur = [], []
    for i in range(trials):
        d = dists[i % len(dists)]
        base.append([rng.choice(d, len(d)) for _ in range(repeats)])
        cur.append([rng.choice(d, len(d)) * (1 + slowdown) for _ in range(repeats)])
    b, c = _synthetic_run(base), _synthetic_run(cur)
    t = gate(b, c, threshold).set_index("strategy")
    order = [f"trial{i}" for i in range(trials)]
    out = pd.DataFrame({"cell": [i % len(dists) for i in range(trials)], "repeats": repeats})
    for col in ("shift", "shift_low", "shift_high", "p_value", "noise_floor", "n_base", "n_cur", "unit",
                "verdict", "note"):
        out[col] = t.loc[order, col].to_numpy()
    if single_run:
        out["verdict_single_run"] = gate(b, c, threshold, single_run=True).set_index("strategy").loc[
            order, "verdict"].to_numpy()
    return out


def rates(trials: pd.DataFrame, threshold: float = 0.05, col: str = "verdict") -> dict[str, float]:
    """Shares of verdicts (from column ``col``), and the detection rate among the resolvable pairs:
    those whose noise floor is at or below the threshold (a finite interval narrower than it)."""
    v = trials[col]
    floor = pd.to_numeric(trials["noise_floor"], errors="coerce")
    res = v[floor <= threshold]
    return {"n": int(len(v)), "regression": float((v == "regression").mean()),
            "improvement": float((v == "improvement").mean()), "same": float((v == "same").mean()),
            "noisy": float((v == "noisy").mean()), "resolvable": float((floor <= threshold).mean()),
            "regression_of_resolvable": float((res == "regression").mean()) if len(res) else float("nan")}


def _run(out: Path, args: argparse.Namespace) -> Path:
    """One small CPU run holding the plain strategy and its slowed twin; returns the run folder."""
    strategies = ",".join([args.strategy, f"tests.regress_helpers:{SLOW_CLASS[args.strategy]}"])
    cmd = [sys.executable, "-m", "bench", "run", "--device", "cpu", "--backends", "gloo", "--workloads",
           args.workload, "--strategies", strategies, "--world-sizes", str(args.world_size), "--steps",
           str(args.steps), "--warmup", str(args.warmup), "--profile-steps", "0", "--sample-hz", "0",
           "--no-progress", "--out", str(out)]
    env = child_env(args.world_size, threads=False)
    env["OMP_NUM_THREADS"] = "1"  # every rank one thread: the trials compare code, not core counts
    before = set(out.glob("*")) if out.exists() else set()
    p = run_tree(cmd, env=env, timeout_s=None, stdout=subprocess.DEVNULL, stderr=None)
    if p.returncode:
        raise subprocess.CalledProcessError(p.returncode, cmd)
    (run_dir,) = set(out.glob("*")) - before
    return run_dir


def _load(run_dirs: list[Path], strategy: str) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    """One strategy's cell from one or more runs as a single run: the steps of run k become repeat
    k (the slowed twin is relabelled as the strategy it slows)."""
    from bench.results.run import load_run

    cells, steps_all, meta = None, [], {}
    for k, d in enumerate(run_dirs):
        c, s, m = load_run(d)
        c = c[c["strategy"] == strategy]
        s = s[s["cell_id"].isin(c["cell_id"])].copy()
        if cells is None:
            cells, meta = c.copy(), m
        s["cell_id"] = cells["cell_id"].iloc[0]
        s["repeat"] = k
        steps_all.append(s)
    cells["strategy"] = SLOW.get(strategy, strategy)
    steps = pd.concat(steps_all, ignore_index=True)
    if len(run_dirs) == 1:
        steps = steps.drop(columns="repeat")
    return cells, steps, meta


def collect(args: argparse.Namespace) -> list[Path]:
    """``args.runs_total`` small CPU runs, one after another (or the ones already in ``--out``
    with ``--reuse``)."""
    out = Path(args.out)
    runs = sorted(p for p in out.glob("2*") if (p / "cells.parquet").exists()) if args.reuse else []
    while len(runs) < args.runs_total:
        runs.append(_run(out, args))
        print(f"run {len(runs)}/{args.runs_total}: {runs[-1]}", flush=True)
    return runs[: args.runs_total]


def real_pairs(runs: list[Path], args: argparse.Namespace, repeats: int) -> pd.DataFrame:
    """Pairs of real runs. Without repeats, pair i is (run i, run i+1). With R repeats, pair i is
    runs i, i+2, .. (BASE) against runs i+1, i+3, .. (CURRENT): interleaved in time, as repeats
    of a CI job would be. A/A compares the plain cells; A/B the plain BASE with the slowed CURRENT,
    so drift between runs weighs on both rates."""
    rows = []
    span = 2 * max(repeats, 1)
    for i in range(len(runs) - span + 1):
        a, b = runs[i:i + span:2], runs[i + 1:i + span:2]
        base = _load(a, args.strategy)
        for kind, cur in (("A/A", _load(b, args.strategy)), ("A/B +5%", _load(b, args.slow))):
            r = gate(base, cur, args.threshold).iloc[0]
            single = gate(base, cur, args.threshold, single_run=True).iloc[0]["verdict"]
            rows.append(dict(repeats=repeats, pair=i, kind=kind, verdict=r["verdict"], verdict_single_run=single,
                             shift=r["shift"], low=r["shift_low"], high=r["shift_high"], p=r["p_value"],
                             noise_floor=r["noise_floor"], unit=r["unit"], note=r["note"]))
    return pd.DataFrame(rows)


def history_pairs(runs: list[Path], args: argparse.Namespace, k: int = 10) -> pd.DataFrame:
    """CURRENT = run i + k (one run, plain or slowed) against a history of runs i .. i+k-1 (their
    per-run medians: the run-to-run noise measured, as ``compare --history`` does)."""
    from bench.gate.samples import Samples

    med = {}
    for j, r in enumerate(runs):
        c, s, _ = _load([r], args.strategy)
        med[j] = float(np.median(step_times(s)["step_time_s"]))
    rows = []
    for i in range(len(runs) - k):
        base = _load([runs[i]], args.strategy)
        hist = {int(base[0]["cell_id"].iloc[0]): Samples(np.array([med[j] for j in range(i, i + k)]), "runs")}
        for kind, strat in (("A/A", args.strategy), ("A/B +5%", args.slow)):
            cur = _load([runs[i + k]], strat)
            r = gate(base, cur, args.threshold, base_samples=hist).iloc[0]
            single = gate(base, cur, args.threshold, single_run=True, base_samples=hist).iloc[0]["verdict"]
            rows.append(dict(repeats=f"history of {k} runs", pair=i, kind=kind, verdict=r["verdict"],
                             verdict_single_run=single, shift=r["shift"], low=r["shift_low"], high=r["shift_high"],
                             p=r["p_value"], noise_floor=r["noise_floor"], unit=r["unit"], note=r["note"]))
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.calibrate", description=__doc__.split("\n")[0])
    p.add_argument("--runs-total", type=int, default=30, help="small CPU runs to make (0: synthetic only)")
    p.add_argument("--repeats", default="1,5", help="comma list: runs pooled as repeats per side of a real pair")
    p.add_argument("--reuse", action="store_true", help="reuse the runs already in --out")
    p.add_argument("--synthetic", type=int, default=408, help="synthetic pairs per setting")
    p.add_argument("--workload", default="mlp")
    p.add_argument("--strategy", default="single", choices=sorted(set(SLOW.values())))
    p.add_argument("--world-size", type=int, default=1)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--threshold", type=float, default=0.05)
    p.add_argument("--runs", required=True, type=Path,
                   help="a recorded run folder, or a folder of them (e.g. results), whose steps.parquet the "
                        "synthetic pairs resample")
    p.add_argument("--out", default="/tmp/parbench-calibrate")
    args = p.parse_args(argv)
    args.slow = {v: k for k, v in SLOW.items()}[args.strategy]
    report: dict[str, object] = {}
    paths = [args.runs / "steps.parquet"] if (args.runs / "steps.parquet").exists() else \
        sorted(args.runs.glob("*/steps.parquet"))
    dists = real_distributions(paths)
    report["compare defaults"] = shipped_defaults()
    print(f"parbench compare defaults, as shipped: {report['compare defaults']}", flush=True)
    for reps in ((1, 5, 7, 10) if args.synthetic else ()):
        for slow in (0.0, 0.05):
            trials = synthetic_trials(dists, args.synthetic, slow, reps, args.threshold, seed=reps, single_run=True)
            for label, col in (("shipped default", "verdict"), ("--single-run", "verdict_single_run")):
                report[f"synthetic repeats={reps} slowdown={slow:.0%} {label}"] = r = rates(trials, args.threshold,
                                                                                            col)
                print(f"synthetic, {len(dists)} recorded cells, repeats={reps}, slowdown {slow:.0%}, {label}: {r}",
                      flush=True)
    if args.runs_total:
        t0 = time.time()
        runs = collect(args)
        report["real_runs_wall_s"] = round(time.time() - t0, 1)
        real = pd.concat([real_pairs(runs, args, int(r)) for r in args.repeats.split(",")]
                         + [history_pairs(runs, args)], ignore_index=True)
        real.to_csv(Path(args.out) / "pairs.csv", index=False)
        for (reps, kind), g in real.groupby(["repeats", "kind"]):
            for label, col in (("shipped default", "verdict"), ("--single-run", "verdict_single_run")):
                report[f"real repeats={reps} {kind} {label}"] = r = rates(g, args.threshold, col)
                print(f"real CPU pairs, repeats={reps}, {kind}, {label}: {r}", flush=True)
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
