"""The run folder: schema, parquet writes that survive a killed run, metadata, derived columns.

``DIR/<run-id>/`` holds ``cells.parquet`` (one row a cell), ``steps.parquet`` (one row a rank and
step) and ``meta.json``. Tables are rewritten whole, through a temporary file and an atomic rename,
after every cell: a run killed at any moment leaves the last complete version on disk.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import subprocess
import sys
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from bench import SCHEMA_VERSION, UserError, __version__

#: cells.parquet columns, in order. Strategies may add more (mesh, micro_batches, ...).
CELL_COLUMNS: dict[str, str] = {
    "run_id": "string", "cell_id": "Int64", "workload": "string", "strategy": "string",
    "backend": "string", "device": "string", "world_size": "Int64", "nproc": "Int64",
    "status": "string", "reason": "string", "role": "string",
    "steps": "Int64", "warmup": "Int64", "global_batch": "Int64", "precision": "string",
    "step_time_median_s": "float64", "step_time_p95_s": "float64", "step_time_mean_s": "float64",
    "step_time_ci_low_s": "float64", "step_time_ci_high_s": "float64",
    "throughput_samples_s": "float64", "scaling_efficiency": "float64", "mfu": "float64",
    "peak_mem_bytes": "float64", "loss_final": "float64",
    "parity_rel_err": "float64", "parity_tol": "float64", "parity_ok": "boolean",
    "params": "Int64", "flops_per_sample": "float64", "gpu_name": "string",
    "cell_wall_s": "float64", "overhead_s": "float64",
}
STEP_COLUMNS: dict[str, str] = {
    "run_id": "string", "cell_id": "Int64", "rank": "Int64", "step": "Int64", "phase": "string",
    "step_time_s": "float64", "t_unix": "float64", "loss": "float64", "loss_weight": "float64",
}
#: relative tolerance of the parity check, by precision
PARITY_TOL = {"fp32": 1e-5, "bf16": 2e-2}


def new_run_id() -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:4]


def frame(rows: list[dict[str, Any]], schema: dict[str, str]) -> pd.DataFrame:
    """Rows to a frame with the schema's columns first (typed), extra columns after."""
    df = pd.DataFrame(rows)
    for col, dtype in schema.items():
        if col not in df:
            df[col] = pd.Series([None] * len(df), index=df.index, dtype="object")
        if dtype == "float64":
            df[col] = pd.to_numeric(df[col], errors="coerce").astype("float64")
        else:
            df[col] = df[col].astype(dtype)
    extra = [c for c in df.columns if c not in schema]
    return df[list(schema) + extra]


def write_atomic(df: pd.DataFrame, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    df.to_parquet(tmp, index=False)
    os.replace(tmp, path)


def require_columns(df: pd.DataFrame, cols: list[str], what: str) -> None:
    """Fail with the missing column's name rather than a KeyError deep in an analysis."""
    missing = [c for c in cols if c not in df.columns]
    if missing:
        raise UserError(f"{what} lacks column(s) {', '.join(missing)}; was it written by parbench "
                        f"schema {SCHEMA_VERSION}?")


def global_losses(steps: pd.DataFrame) -> pd.Series:
    """Per (cell_id, step): the global-batch loss, sum over ranks of loss * loss_weight."""
    s = steps.dropna(subset=["loss"])
    return (s["loss"] * s["loss_weight"]).groupby([s["cell_id"], s["step"]]).sum()


def derive(cells: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """Fill the columns that need other cells: parity against the single-device reference of the
    same workload/device/precision, and scaling efficiency against its throughput."""
    cells = cells.copy()
    if cells.empty:
        return cells
    losses = global_losses(steps) if not steps.empty else pd.Series(dtype=float)
    ok = cells["status"] == "ok"
    refs = cells[ok & (cells["strategy"] == "single")]
    for i, row in cells[ok].iterrows():
        ref = refs[(refs["workload"] == row["workload"]) & (refs["device"] == row["device"])
                   & (refs["precision"] == row["precision"])]
        if ref.empty:
            continue
        ref = ref.iloc[0]
        tput = ref["throughput_samples_s"]
        if pd.notna(tput) and tput > 0 and pd.notna(row["throughput_samples_s"]):
            cells.at[i, "scaling_efficiency"] = row["throughput_samples_s"] / (row["world_size"] * tput)
        if str(row.get("role")) == "independent":  # collaborating models train other models: no parity
            continue
        try:
            mine, theirs = losses.loc[row["cell_id"]], losses.loc[ref["cell_id"]]
        except KeyError:
            continue
        common = mine.index.intersection(theirs.index)
        if len(common) == 0 or len(common) < len(theirs):
            continue
        a, b = mine.loc[common].to_numpy(), theirs.loc[common].to_numpy()
        err = float(np.max(np.abs(a - b) / np.maximum(np.abs(b), 1e-12)))
        tol = PARITY_TOL.get(str(row["precision"]), 1e-5)
        cells.at[i, "parity_rel_err"] = err
        cells.at[i, "parity_tol"] = tol
        cells.at[i, "parity_ok"] = bool(err <= tol)
    return cells


class RunWriter:
    """Accumulates rows for one run folder and rewrites its tables after every cell."""

    def __init__(self, run_dir: Path):
        self.dir = run_dir
        self.dir.mkdir(parents=True, exist_ok=False)
        self.run_id = run_dir.name
        self.cells: list[dict[str, Any]] = []
        self.steps: list[dict[str, Any]] = []
        self.extra: dict[str, list[dict[str, Any]]] = {}  # other tables: comm, samples, ...

    def add(self, row: dict[str, Any], steps: list[dict[str, Any]] = (),
            extra: dict[str, list[dict[str, Any]]] | None = None) -> None:
        self.cells.append({"run_id": self.run_id, **row})
        self.steps.extend({"run_id": self.run_id, "cell_id": row["cell_id"], **s} for s in steps)
        for name, rows in (extra or {}).items():
            self.extra.setdefault(name, []).extend(rows)
        self.flush()

    def set_table(self, name: str, rows: list[dict[str, Any]]) -> None:
        """Replace a whole side table (the sampler's rows); written at the next flush."""
        self.extra[name] = rows

    def frames(self) -> tuple[pd.DataFrame, pd.DataFrame]:
        steps = frame(self.steps, STEP_COLUMNS)
        cells = derive(frame(self.cells, CELL_COLUMNS), steps).sort_values("cell_id", kind="stable")
        return cells, steps

    def flush(self) -> None:
        cells, steps = self.frames()
        write_atomic(cells, self.dir / "cells.parquet")
        write_atomic(steps, self.dir / "steps.parquet")
        for name, rows in self.extra.items():
            if rows:
                write_atomic(pd.DataFrame(rows), self.dir / f"{name}.parquet")


def load_run(run_dir: str | os.PathLike) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, Any]]:
    """cells, steps and meta of a run folder; a one-line UserError if it is not one."""
    d = Path(run_dir)
    if not (d / "cells.parquet").is_file():
        raise UserError(f"{d} is not a parbench run folder (no cells.parquet); pass results/<run-id>")
    cells = pd.read_parquet(d / "cells.parquet")
    steps = pd.read_parquet(d / "steps.parquet") if (d / "steps.parquet").is_file() else frame([], STEP_COLUMNS)
    meta = json.loads((d / "meta.json").read_text()) if (d / "meta.json").is_file() else {}
    require_columns(cells, ["workload", "strategy", "backend", "world_size", "status"], str(d / "cells.parquet"))
    return cells, steps, meta


def _git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5)
        if out.returncode:
            return None
        return out.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def machine_meta() -> dict[str, Any]:
    """Versions and hardware, for meta.json (cheap: no process group, no NCCL init)."""
    import torch

    from bench.hardware import gpu_count, gpu_names

    meta: dict[str, Any] = {
        "host": socket.gethostname(), "platform": platform.platform(), "python": sys.version.split()[0],
        "torch": torch.__version__, "cuda": torch.version.cuda, "parbench": __version__,
        "gpus": gpu_names(), "gpu_count": gpu_count(),
    }
    try:
        meta["nccl"] = ".".join(map(str, torch.cuda.nccl.version())) if meta["gpu_count"] else None
    except Exception:  # noqa: BLE001
        meta["nccl"] = None
    try:
        import pynvml

        pynvml.nvmlInit()
        meta["driver"] = pynvml.nvmlSystemGetDriverVersion()
        pynvml.nvmlShutdown()
    except Exception as e:  # noqa: BLE001 - no NVML is normal on CPU machines
        meta["driver"] = None
        meta["nvml_unavailable"] = f"{type(e).__name__}: {e}"
    return meta


def write_meta(run_dir: Path, config: dict[str, Any], **more: Any) -> dict[str, Any]:
    meta = {
        "schema_version": SCHEMA_VERSION, "run_id": run_dir.name,
        "created_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "git_commit": _git_commit(), "command_line": sys.argv, "config": config,
        **machine_meta(), **more,
    }
    (run_dir / "meta.json").write_text(json.dumps(meta, indent=2, default=str))
    return meta
