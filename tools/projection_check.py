"""The projection check with its spread: DDP, FSDP and tensor parallel projected from a run's 1- and
2-GPU cells with the communication variant :func:`bench.comm.projection.fixed_variant` picks from
the 2-GPU cell alone, against each repeat of the run's measured cells at more GPUs.

``python -m tools.projection_check RUN --sweep SWEEP.parquet [--out DIR]``

RUN is a ``parbench run`` folder with cells, steps and comm tables (profiled steps on) and a
single-device cell; SWEEP is the ``collectives.parquet`` of a ``parbench comm`` sweep of the same
machine (its eager rows fit the model). For each family and each world size above 2 that RUN
measured: the fixed prediction, and the range it takes with the 2-GPU step of each 2-GPU repeat;
the measured median and per-repeat range; the error against each repeat's median (median, min,
max, number of repeats); the 1- and 2-GPU inputs' repeats and ranges. Prints a markdown table and
writes ``projection_check.csv``, ``projection_check.md`` and ``projection_check.json`` (run id,
torch, NCCL, GPU, date and command of the run and of the sweep; the fixed variants and their
inputs) into DIR.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
from pathlib import Path
from typing import Any

import pandas as pd

from bench.comm.model import fit
from bench.comm.projection import STRATEGIES, Network, check_with_repeats, fixed_variant, project
from bench.core.errors import UserError
from bench.results.run import load_run
from bench.results.store import read_table

#: meta.json fields the sidecar keeps, run's and sweep's alike
META_KEYS = ("run_id", "created_utc", "host", "torch", "cuda", "nccl", "driver", "gpu_count", "gpus", "python",
             "parbench", "git_commit")


def source(meta: dict[str, Any]) -> dict[str, Any]:
    """The identifying fields of a run's meta.json, the GPUs as 'Nx NAME' and the command as one line."""
    out = {k: meta.get(k) for k in META_KEYS if k in meta}
    gpus = meta.get("gpus") or []
    if gpus:
        names = sorted(set(map(str, gpus)))
        out["gpus"] = ", ".join(f"{sum(g == n for g in gpus)}x {n}" for n in names)
    cmd = meta.get("command_line")
    out["command"] = shlex.join(map(str, cmd)) if isinstance(cmd, list) else meta.get("command")
    return out


def load_sweep(paths: list[str]) -> tuple[pd.DataFrame, list[dict[str, Any]]]:
    """The sweeps' eager, ok rows (CUDA-graph replays left out: training calls are eager) and the
    meta.json beside each file, where there is one."""
    frames, metas = [], []
    for p in map(Path, paths):
        if not p.is_file():
            raise UserError(f"{p}: no such sweep file; pass the collectives.parquet of a parbench comm run")
        frames.append(pd.read_parquet(p))
        m = p.parent / "meta.json"
        metas.append(source(json.loads(m.read_text())) if m.is_file() else {"file": str(p)})
    sw = pd.concat(frames, ignore_index=True)
    if "graph" in sw:
        sw = sw[~sw["graph"].fillna(False).astype(bool)]
    return sw, metas


def run_backend(cells: pd.DataFrame) -> str:
    """The backend of the run's 2-GPU cells of the projected families (nccl first where both)."""
    two = cells[cells["strategy"].isin(STRATEGIES) & (cells["world_size"] == 2) & (cells["status"] == "ok")]
    found = sorted(set(two["backend"].dropna()), key=lambda b: (b != "nccl", b))
    if not found:
        raise UserError(f"the run has no ok 2-GPU cell of {', '.join(STRATEGIES)}: nothing to project from")
    return found[0]


def check(run: str | Path, sweeps: list[str], *, backend: str | None = None, gpus_per_node: int = 8,
          inter_node_gbs: float = 50.0) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, Any]]:
    """(check rows, projection rows, sidecar) of ``run`` against the model fitted on ``sweeps``."""
    cells, steps, meta = load_run(run)
    comm = read_table(run, "comm")
    if comm.empty:
        raise UserError(f"{run} recorded no collective calls (comm.parquet): run it with --profile-steps 1 or more")
    cfg = meta.get("config") or {}
    backend = backend or run_backend(cells)
    device = cfg.get("device") or ("cuda" if backend == "nccl" else "cpu")
    profile_steps = int(cfg.get("profile_steps") or 2)
    sw, sweep_meta = load_sweep(sweeps)
    if sw[(sw["backend"] == backend) & (sw["device"] == device) & (sw["world_size"] == 2)].empty:
        raise UserError(f"the sweep has no {backend} rows on {device} at world size 2: the model needs them")
    worlds = tuple(sorted(int(w) for w in cells.loc[(cells["status"] == "ok") & (cells["world_size"] > 2)
                                                    & cells["strategy"].isin(STRATEGIES), "world_size"].unique()))
    if not worlds:
        raise UserError(f"{run} measured no ok cell of {', '.join(STRATEGIES)} above 2 GPUs: nothing to check")
    proj = project(cells, comm, fit(sw), worlds=worlds, steps=profile_steps, backend=backend,
                   network=Network(gpus_per_node=gpus_per_node, inter_node_gbs=inter_node_gbs, device=device))
    table = check_with_repeats(proj, cells, steps, backend=backend)
    rule = proj.drop_duplicates("strategy").set_index("strategy")
    side = {
        "file": "projection_check.csv",
        "what": ("Projected step time of DDP, FSDP and tensor parallel from the run's 1- and 2-GPU cells, with one "
                 "communication variant per family fixed by bench.comm.projection.fixed_variant from the 2-GPU "
                 "cell alone, against each repeat of the run's measured cells above 2 GPUs"),
        "rows": len(table),
        "rule": {"function": "bench.comm.projection.fixed_variant",
                 "text": " ".join((fixed_variant.__doc__ or "").split()),
                 "variants": rule["variant_fixed"].to_dict(),
                 "inputs_ms_per_step_2gpu": {s: {"model": r["comm_model_2gpu_s"] * 1e3,
                                                 "fastest_rank": r["comm_fastest_2gpu_s"] * 1e3,
                                                 "recorded_mean_rank": r["comm_recorded_2gpu_s"] * 1e3}
                                             for s, r in rule.iterrows()}},
        "backend": backend, "device": device, "profile_steps": profile_steps,
        "errors": "pred / (median step of one repeat) - 1, a step being its slowest rank's; median, min, max over "
                  "the measured cell's repeats",
        "sources": [*({"sweep": m} for m in sweep_meta), {"cells_from": source(meta)}],
    }
    return table, proj, side


def _ms(x: float) -> str:
    return "-" if not math.isfinite(x) else f"{x * 1e3:.1f}"


def _pct(x: float) -> str:
    return "-" if not math.isfinite(x) else f"{x * 100:+.1f}%"


def _span(mid: float, lo: float, hi: float, n: int) -> str:
    """'61.9 [60.1, 63.0] (5)' in ms; one repeat has no interval."""
    if n < 2:
        return f"{_ms(mid)} ({n} repeat{'s' if n != 1 else ''}, no interval)"
    return f"{_ms(mid)} [{_ms(lo)}, {_ms(hi)}] ({n})"


def markdown(table: pd.DataFrame, side: dict[str, Any]) -> str:
    """The check as a short markdown table, headed by the run and the fixed variants."""
    run = next((s["cells_from"] for s in side["sources"] if "cells_from" in s), {})
    lines = [f"Projection check, fixed variant per family (bench.comm.projection.fixed_variant); run "
             f"{run.get('run_id')} ({run.get('gpus') or side['device']}, torch {run.get('torch')}, "
             f"nccl {run.get('nccl')}, {run.get('created_utc')}); ms per step; [min, max] over repeats (n).",
             "",
             "| family | GPUs | variant | projected [from 2-GPU repeats] | measured (repeats) | error: median "
             "[min, max] over repeats | 1-GPU input | 2-GPU input |",
             "|---|---|---|---|---|---|---|---|"]
    for _, r in table.iterrows():
        n = int(r["repeats"])
        err = (f"{_pct(r['err_median'])} [{_pct(r['err_min'])}, {_pct(r['err_max'])}] ({n})" if n >= 2
               else f"{_pct(r['err_median'])} (1 repeat, no interval)" if n == 1 else "-")
        pred = (f"{_ms(r['pred_fixed_s'])} [{_ms(r['pred_fixed_lo_s'])}, {_ms(r['pred_fixed_hi_s'])}]"
                if r["x2_repeats"] >= 2 else f"{_ms(r['pred_fixed_s'])} (2-GPU input: no interval)")
        lines.append(f"| {r['strategy']} | {r['world_size']} | {r['variant_fixed']} | {pred} | "
                     f"{_span(r['measured_s'], r['measured_lo_s'], r['measured_hi_s'], r['repeats'])} | {err} | "
                     f"{_span(r['x1_s'], r['x1_lo_s'], r['x1_hi_s'], r['x1_repeats'])} | "
                     f"{_span(r['x2_s'], r['x2_lo_s'], r['x2_hi_s'], r['x2_repeats'])} |")
    lines += ["", "Rule inputs, 2-GPU cell, ms per rank and step (calibrated when fastest - model > "
              "recorded - fastest):"]
    for s, v in side["rule"]["inputs_ms_per_step_2gpu"].items():
        lines.append(f"* {s}: model {v['model']:.2f}, fastest rank {v['fastest_rank']:.2f}, recorded "
                     f"{v['recorded_mean_rank']:.2f} -> {side['rule']['variants'][s]}")
    return "\n".join(lines)


def to_csv_frame(table: pd.DataFrame) -> pd.DataFrame:
    """The check rows with times in ms and errors in %, columns in the table's order, as written
    to the CSV."""
    out = table.copy()
    ren = {}
    for c in table.columns:
        if c.endswith("_s"):
            out[c], ren[c] = table[c] * 1e3, c[:-2] + "_ms"
        elif c.startswith("err_"):
            out[c], ren[c] = table[c] * 100, c + "_pct"
    return out.rename(columns=ren)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.projection_check", description=__doc__.split("\n\n")[0])
    ap.add_argument("run", help="parbench run folder (cells, steps, comm tables; 1-, 2- and more-GPU cells)")
    ap.add_argument("--sweep", nargs="+", required=True, help="collectives.parquet of a parbench comm sweep")
    ap.add_argument("--out", default=".", help="folder for projection_check.{csv,md,json} (default: here)")
    ap.add_argument("--backend", help="backend of the cells to project (default: the run's, nccl first)")
    ap.add_argument("--gpus-per-node", type=int, default=8)
    ap.add_argument("--inter-node-gbs", type=float, default=50.0)
    args = ap.parse_args(argv)
    try:
        table, _, side = check(args.run, args.sweep, backend=args.backend, gpus_per_node=args.gpus_per_node,
                               inter_node_gbs=args.inter_node_gbs)
    except UserError as e:
        print(f"projection_check: {e}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    side["check_command"] = shlex.join(["python3", "-m", "tools.projection_check", *(argv or sys.argv[1:])])
    to_csv_frame(table).to_csv(out / "projection_check.csv", index=False)
    md = markdown(table, side)
    (out / "projection_check.md").write_text(md + "\n")
    (out / "projection_check.json").write_text(json.dumps(side, indent=1, default=str) + "\n")
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
