"""How far each strategy's losses are from one device's, against the reference's own rounding.

Runs one CPU/gloo matrix (every workload given, every strategy given, the world sizes given, the
parity horizon's steps) and writes, per cell, the parity error, its reference's ``parity_rounding``
(bench.train.rounding) and their ratio: the evidence for ``ROUNDING_FACTOR`` in
bench/results/derived.py. A passing strategy should sit well below the factor; a BatchNorm model
under data parallelism (a difference in semantics) well above it.

    python -m tools.parity_rounding --out /tmp/pr --csv docs/evidence/parity-rounding-cpu.csv

``--run RUN`` judges a measured run again (after a change to the tolerance rule) without measuring.
"""

from __future__ import annotations

import argparse
import sys

import pandas as pd

from bench.core.config import build_config
from bench.results.run import load_run
from bench.stats.parity import PARITY_STEPS
from bench.train import launcher

WORKLOADS = "gpt-tiny,mlp,convnet,tests.foreign_models:groupnorm_cnn,tests.foreign_models:batchnorm_cnn"
STRATEGIES = "single,ddp,allreduce,allreduce-bucketed,fsdp,ddp-zero1,pipeline-1f1b,tensor"


def measure(out: str, workloads: str, strategies: str, world_sizes: str, optimizers: str):
    """One run over the matrix; its folder."""
    flags = {"device": "cpu", "backends": "gloo", "world_sizes": world_sizes, "strategies": strategies,
             "workloads": workloads, "steps": PARITY_STEPS - 2, "warmup": 2, "settle": 0, "target_ci": 0,
             "profile_steps": 0, "sample_hz": 0, "out": out, "training": {"optimizer": optimizers}}
    return launcher.run(build_config(toml=None, flags=flags, gpus=0), 0)


def table(run) -> pd.DataFrame:
    """A row per non-reference cell of the run folder ``run`` with its error, its reference's
    rounding and their ratio, judged by the tolerance rule of this version (it is derived when the
    folder is read)."""
    cells, _, _ = load_run(run)
    refs = cells[cells["role"] == "reference"]
    key = ["workload", "optimizer"]
    rounding = refs.set_index(key)["parity_rounding"]
    rows = cells[(cells["role"] != "reference") & cells["parity_rel_err"].notna()].copy()
    rows["parity_rounding"] = [rounding.get(tuple(k)) for k in rows[key].itertuples(index=False)]
    rows["ratio"] = rows["parity_rel_err"] / rows["parity_rounding"]
    cols = ["workload", "optimizer", "strategy", "world_size", "parity_rel_err", "parity_rounding", "ratio",
            "parity_tol", "parity_ok"]
    return rows[cols].sort_values(["workload", "optimizer", "ratio"]).reset_index(drop=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", help="folder for the run")
    p.add_argument("--run", help="judge this run folder again instead of measuring")
    p.add_argument("--csv", help="write the table here")
    p.add_argument("--workloads", default=WORKLOADS)
    p.add_argument("--strategies", default=STRATEGIES)
    p.add_argument("--world-sizes", default="2,4")
    p.add_argument("--optimizers", default="sgd,adamw")
    a = p.parse_args(argv)
    if not (a.run or a.out):
        p.error("give --out DIR to measure, or --run RUN to judge a measured run again")
    t = table(a.run or measure(a.out, a.workloads, a.strategies, a.world_sizes, a.optimizers))
    if a.csv:
        t.to_csv(a.csv, index=False, float_format="%.3g")
    print(t.to_string(index=False, float_format=lambda x: f"{x:.3g}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
