"""`parbench slurm`: write (and with --submit, submit) an sbatch script for a multi-node run."""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path
from typing import Any

from bench.core.errors import UserError
from bench.core.values import INT_LIST_MAX

#: run flags the script sets itself (per node) or that make no sense in a batch job
OWN = {"nnodes", "node_rank", "rdzv_endpoint", "out", "resume", "no_progress"}


def register(sub: Any) -> argparse.ArgumentParser:
    from bench.cli.common import add_run_args

    p = sub.add_parser("slurm", help="write an sbatch script for a run on several nodes (--submit: submit it)")
    p.add_argument("--nodes", type=int, required=True, help="nodes to allocate; one parbench launcher each")
    p.add_argument("--gpus-per-node", dest="gpus_per_node", type=int, required=True,
                   help="GPUs per node (0 for a CPU run with --device cpu)")
    p.add_argument("--script", "-o", help="where to write the script (default parbench-NxG.sbatch)")
    p.add_argument("--submit", action="store_true", help="submit it with sbatch")
    p.add_argument("--submit-timeout", dest="submit_timeout_s", type=float, default=120.0,
                   help="seconds to wait for sbatch's answer (default 120)")
    p.add_argument("--port", type=int, default=29400, help="rendezvous port on the first node (default 29400)")
    p.add_argument("--time", help="sbatch --time: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS")
    p.add_argument("--partition", help="sbatch --partition")
    p.add_argument("--account", help="sbatch --account")
    p.add_argument("--cpus-per-task", dest="cpus_per_task", type=int, help="sbatch --cpus-per-task")
    p.add_argument("--job-name", dest="job_name", default="parbench")
    p.add_argument("--python", default=sys.executable,
                   help="the interpreter with parbench installed, as every node sees it (default: this one)")
    p.add_argument("--rdzv-timeout", dest="rdzv_timeout_s", type=float,
                   help="seconds the nodes wait for each other (default 300)")
    run = p.add_argument_group("run options (passed to parbench run on every node)")
    add_run_args(run, grouped=False)
    p.set_defaults(func=cmd_slurm, _run_actions=list(run._group_actions))
    return p


def run_argv(args: argparse.Namespace, parser_actions) -> list[str]:
    """The `parbench run` flags the user gave, rebuilt from the parsed values (paths absolute:
    the job may start elsewhere)."""
    out: list[str] = []
    for a in parser_actions:
        if not a.option_strings or a.dest in OWN | {"help"}:
            continue
        v = getattr(args, a.dest, None)
        if isinstance(a, argparse._StoreFalseAction) and v is False:  # a switch that turns a default off
            out.append(max(a.option_strings, key=len))
            continue
        if v is None or v is False or v == []:
            continue
        flag = max(a.option_strings, key=len)
        if a.dest == "config":
            v = str(Path(v).resolve())
        if isinstance(a, argparse._StoreTrueAction):
            out.append(flag)
        elif isinstance(a, argparse._AppendAction):
            for item in v:
                out += [flag, str(item)]
        else:
            out += [flag, str(v)]
    return out


def cmd_slurm(args: argparse.Namespace) -> int:
    from bench.multinode.slurm import SlurmJob, render, submit

    if args.nodes is None or args.nodes < 1:
        raise UserError(f"--nodes {args.nodes} must be >= 1; e.g. --nodes 2")
    if args.gpus_per_node < 0:
        raise UserError(f"--gpus-per-node {args.gpus_per_node} must be >= 0 (0 for a CPU run)")
    if args.nodes * max(args.gpus_per_node, 1) > INT_LIST_MAX:
        raise UserError(f"--nodes {args.nodes} x --gpus-per-node {args.gpus_per_node} is more than "
                        f"{INT_LIST_MAX:,} devices (a typo?); e.g. --nodes 2 --gpus-per-node 8")
    if not 1 <= args.port <= 65535:
        raise UserError(f"--port {args.port} must be from 1 to 65535, e.g. --port 29400")
    if not (args.submit_timeout_s > 0 and math.isfinite(args.submit_timeout_s)):
        raise UserError(f"--submit-timeout {args.submit_timeout_s:g} must be a number of seconds > 0, "
                        "e.g. --submit-timeout 120")
    cfg = _checked_run(args)
    out = str(Path(cfg.output.out).resolve())
    given = run_argv(args, getattr(args, "_run_actions", []))
    if args.rdzv_timeout_s is not None:
        given += ["--rdzv-timeout", f"{cfg.nodes.rdzv_timeout_s:g}"]
    job = SlurmJob(nodes=args.nodes, gpus_per_node=args.gpus_per_node, run_args=given, out=out,
                   python=args.python, workdir=os.getcwd(), port=args.port, job_name=args.job_name, time=args.time,
                   partition=args.partition, account=args.account, cpus_per_task=args.cpus_per_task)
    path = Path(args.script or f"parbench-{args.nodes}x{args.gpus_per_node}.sbatch").absolute()
    if path.is_dir():
        raise UserError(f"--script {str(path)!r} is a folder; pass a file name, e.g. --script job.sbatch")
    if path.exists() and not path.is_file():  # a pipe or a device: opening it would block or write elsewhere
        raise UserError(f"--script {str(path)!r} is not a regular file (a pipe or a device); pass a file name, "
                        "e.g. --script job.sbatch")
    try:
        path.write_text(render(job))
    except OSError as e:
        raise UserError(f"--script {str(path)!r} cannot be written ({e.strerror}); pass a writable path") from None
    print(f"wrote {path} ({args.nodes} node(s) x {args.gpus_per_node} GPU(s), results in {out})")
    if not args.submit:
        print(f"submit it with: sbatch {path}")
        return 0
    try:  # Slurm opens --output (inside the results folder) before the script's own mkdir runs
        Path(out).mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"--out {out!r} cannot be created ({e.strerror}); pass a folder on shared storage") from None
    job_id, said = submit(path, timeout_s=args.submit_timeout_s)
    if job_id is None:
        print(f"sbatch printed no job id ({said!r}); check squeue --me; the script is {path}")
    else:
        print(f"submitted job {job_id} ({said}); the script is {path}, the job's log {out}/slurm-{job_id}.out")
    return 0


def _checked_run(args: argparse.Namespace):
    """The run's config, checked as the nodes will see it, so that a typo fails now and not after
    the job waited in the queue; and the planning the nodes will do (an unknown strategy, workload
    or option; build_config alone checks the flags' forms)."""
    from bench.cli.common import run_settings, table_flags
    from bench.core.config import build_config, load_toml
    from bench.plan.matrix import plan

    flags = run_settings(args)
    flags.update(nnodes=args.nodes, rdzv_endpoint=f"slurm-first-node:{args.port}" if args.nodes > 1 else None)
    toml = load_toml(args.config) if args.config else {}
    flags.update(table_flags(args, toml))
    cfg = build_config(toml=toml, flags=flags, gpus=args.gpus_per_node)
    if cfg.matrix.device == "cuda" and args.gpus_per_node == 0:
        raise UserError("--gpus-per-node 0 with a CUDA run; give the GPUs per node or pass --device cpu")
    try:
        plan(cfg, args.gpus_per_node)
    except UserError as e:
        # a user's module may import only in the job's environment (--python): said, not refused
        unloadable = "cannot import" in str(e) or "cannot load" in str(e)
        if not unloadable or not any(":" in x for x in [*cfg.matrix.workloads, *cfg.matrix.strategies]):
            raise
        print(f"note: not checked here, the nodes will import it: {e}")
    return cfg
