"""Predicted against measured peak memory, one row a cell, from run folders.

    python -m tools.memory_table RUN [RUN...] [--csv OUT.csv]

Reads each run's cells (bench.results.run) and prints, per training cell, the memory model's
predicted allocated, reserved and process peaks beside the allocator's allocated and reserved
peaks and NVML's process memory, and the errors; ``--csv`` writes the same table, the evidence
format of docs/evidence/memory-*.csv.
"""

from __future__ import annotations

import argparse
import sys

import pandas as pd

from bench.results.run import load_run

GIB = 2**30
COLUMNS = {  # table column -> cells column (bytes shown in GiB)
    "pred_gib": "mem_pred_bytes", "measured_gib": "peak_mem_bytes",
    "pred_reserved_gib": "mem_pred_reserved_bytes", "reserved_gib": "peak_reserved_bytes",
    "pred_process_gib": "mem_pred_process_bytes", "nvml_process_gib": "nvml_process_bytes",
    "params_gib": "mem_pred_params_bytes", "grads_gib": "mem_pred_grads_bytes",
    "optimizer_gib": "mem_pred_optimizer_bytes", "activations_gib": "mem_pred_activations_bytes",
    "data_gib": "mem_pred_data_bytes", "capacity_gib": "mem_capacity_bytes",
}


def table(folders: list[str]) -> pd.DataFrame:
    """One row per training cell of ``folders``: identity, predicted and measured memory, errors."""
    frames = []
    for folder in folders:
        cells = load_run(folder)[0]
        out = pd.DataFrame({k: cells[k] for k in ("workload", "strategy", "world_size", "global_batch", "optimizer",
                                                  "ac", "compile", "status") if k in cells})
        out["params_b"] = (cells["params"].astype(float) / 1e9).round(3) if "params" in cells else None
        for name, col in COLUMNS.items():
            out[name] = (cells[col].astype(float) / GIB).round(3) if col in cells else None
        for name in ("mem_pred_error", "mem_pred_reserved_error", "mem_pred_process_error"):
            out[name.replace("mem_pred_", "").replace("error", "err") or name] = (
                cells[name].astype(float).round(4) if name in cells else None)
        for name in ("mem_pred_at", "mem_pred_how", "mem_batch_fits", "gpu_name"):
            out[name] = cells[name] if name in cells else None
        out["reason"] = cells["reason"].fillna("").str.slice(0, 160) if "reason" in cells else ""
        frames.append(out)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--csv")
    a = ap.parse_args(argv)
    t = table(a.runs)
    if a.csv:
        t.to_csv(a.csv, index=False)
    short = ["workload", "optimizer", "ac", "global_batch", "status", "pred_gib", "measured_gib", "err",
             "pred_reserved_gib", "reserved_gib", "reserved_err", "pred_process_gib", "nvml_process_gib", "process_err",
             "mem_batch_fits"]
    pd.set_option("display.width", 250)
    pd.set_option("display.max_colwidth", 40)
    print(t[[c for c in short if c in t]].to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
