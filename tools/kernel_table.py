"""GPU time per step by kind of kernel, for cells of runs made with ``--trace``: where two models
(or two strategies) of the same size spend their device time differently.

    python -m tools.kernel_table RUN_DIR [RUN_DIR...] --cell gpt-200m/ddp/4 --cell fused-gpt/ddp/4

A cell is ``workload/strategy/world_size`` (the workload as the cells table names it, its
dimensions and global batch left out); each is looked up in the given run folders (the first that has it ok), and
rank ``--rank``'s GPU trace (``traces/cell<id>-rank<r>-gpu.json``, the profiled steps' device
activity) is read. Kernels are grouped by name into kinds (matrix products, attention,
normalisation, communication, ...); the table gives milliseconds and launches per profiled step
of each kind, then the busy total, the profiled step and the cell's timed median. ``--json PATH``
writes the same numbers.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import pandas as pd

from bench.measure.trace import MARKER, in_steps, step_windows
from bench.results.store import read_table

# The first pattern a kernel's name matches (case-insensitive) names its kind.
KINDS = (
    ("communication", r"nccl"),
    ("attention", r"flash|fmha|attention|sdpa|_efficient_"),
    ("matmul", r"gemm|cutlass|xmma|nvjet|cublas|matmul|splitk"),
    ("normalisation", r"layer_norm|layernorm|rms_?norm|batch_norm"),
    ("softmax / loss", r"softmax|cross_entropy|nll_loss"),
    ("optimizer", r"multi_tensor|foreach|adam|sgd"),
    ("embedding", r"embedding|index_select|indexing_backward|index_put|scatter_add"),
    ("copy / cast", r"copy|memcpy|memset|cat_?array|cast|fill"),
    ("elementwise", r"elementwise|vectorized|unrolled|gelu|reduce_kernel|reduce"),
)
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


def kind(name: str) -> str:
    low = name.lower()
    return next((k for k, pattern in KINDS if re.search(pattern, low)), "other")


def kernel_kinds(trace: dict, steps: int) -> pd.DataFrame:
    """Per kind: ms and launches per step, from a trace's device events: those the profiled steps
    launched when the trace has their markers (not the warm-up step's, nor the markers), else all."""
    ev = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and e.get("cat") in GPU_CATS]
    marked = step_windows(ev, steps)
    if marked:
        ev = in_steps([e for e in ev if MARKER not in e["name"]], marked)
    df = pd.DataFrame({"kind": [kind(e["name"]) for e in ev], "us": [float(e["dur"]) for e in ev]})
    if df.empty:
        return pd.DataFrame(columns=["ms", "launches"])
    out = df.groupby("kind").agg(ms=("us", "sum"), launches=("us", "size"))
    out["ms"] = out["ms"] / 1e3 / steps
    out["launches"] = out["launches"] / steps
    return out


def find_cell(runs: list[Path], key: str) -> tuple[Path, pd.Series]:
    workload, strategy, ws = key.rsplit("/", 2)
    for run in runs:
        cells = read_table(run, "cells")
        hit = cells[(cells["workload"].str.split(r"[\[(]", regex=True).str[0] == workload)
                    & (cells["strategy"] == strategy) & (cells["world_size"] == int(ws)) & (cells["status"] == "ok")]
        if len(hit):
            return run, hit.iloc[-1]
    raise SystemExit(f"cell {key!r} is in none of {', '.join(map(str, runs))} (ok); "
                     "name it workload/strategy/world_size as the cells table does")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--cell", action="append", required=True, help="workload/strategy/world_size (repeatable)")
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--steps", type=int, default=2,
                    help="profiled steps a cell (the run's --profile-steps; 2 unless it was given)")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    cols, facts = {}, {}
    for key in a.cell:
        run, row = find_cell(a.runs, key)
        path = run / "traces" / f"cell{int(row['cell_id'])}-rank{a.rank}-gpu.json"
        if not path.exists():
            raise SystemExit(f"{path} is missing: measure the run with --trace (and profile steps > 0)")
        t = kernel_kinds(json.loads(path.read_text()), a.steps)
        cols[key] = t
        facts[key] = {"busy ms": t["ms"].sum(), "profiled step ms": 1e3 * float(row.get("profiled_step_s") or "nan"),
                      "timed median ms": 1e3 * float(row["step_time_median_s"]),
                      "repeats": int(row.get("repeats_done") or 1)}
    kinds = sorted(set().union(*(c.index for c in cols.values())), key=lambda k: -max(
        c["ms"].get(k, 0.0) for c in cols.values()))
    lines = ["| kind | " + " | ".join(f"{k} ms (launches)" for k in cols) + " |",
             "|---|" + "---|" * len(cols)]
    for k in kinds:
        cells = [f"{c['ms'].get(k, 0.0):.2f} ({c['launches'].get(k, 0.0):.0f})" for c in cols.values()]
        lines.append(f"| {k} | " + " | ".join(cells) + " |")
    for fact in ("busy ms", "profiled step ms", "timed median ms", "repeats"):
        lines.append(f"| {fact} | " + " | ".join(f"{facts[k][fact]:.2f}" if fact != "repeats" else str(facts[k][fact])
                                                 for k in cols) + " |")
    print("\n".join(lines))
    if a.json:
        a.json.write_text(json.dumps({k: {"kinds": cols[k].reset_index().to_dict("records"), **facts[k]}
                                      for k in cols}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
