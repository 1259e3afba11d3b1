"""``parbench comm``: the collective sweep, one torchrun group per (world size, backend).

Writes ``<out>/<run-id>/collectives.parquet`` (one row per op, dtype, size, backend and world size,
plus ``kind == 'reference'`` rows: a plain torch all_reduce loop at the largest size), the fitted
alpha-beta model ``comm_model.parquet`` and ``meta.json`` (with the NVML topology).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from bench.comm.worker import DTYPES, OPS, size_ladder
from bench.core import backends as registry
from bench.core.errors import UserError
from bench.core.spec import outcome
from bench.measure.hardware import cpu_threads, threads_per_rank

_UNITS = {"": 1, "b": 1, "k": 2**10, "kib": 2**10, "kb": 2**10, "m": 2**20, "mib": 2**20, "mb": 2**20,
          "g": 2**30, "gib": 2**30, "gb": 2**30}


def parse_bytes(text: str, flag: str) -> int:
    """'1K', '64MiB', '1G', '4096' -> bytes (binary units: the sweep's sizes are powers of two)."""
    m = re.fullmatch(r"\s*(\d+)\s*([a-zA-Z]*)\s*", str(text))
    if not m or m.group(2).lower() not in _UNITS:
        raise UserError(f"{flag} {text!r} is not a size; use e.g. 1K, 64M, 1G or a number of bytes")
    return int(m.group(1)) * _UNITS[m.group(2).lower()]


def _csv(text: str, allowed: tuple[str, ...] | list[str], flag: str) -> list[str]:
    items = [x.strip() for x in str(text).split(",") if x.strip()]
    if not items:
        raise UserError(f"{flag} is empty; pass a comma list of {', '.join(allowed)}")
    for x in items:
        if x not in allowed:
            raise UserError(f"{flag} has {x!r}; use a comma list of {', '.join(allowed)}")
    return items


@dataclass(kw_only=True)
class CommConfig:
    """Everything one sweep needs; ``to_dict`` goes into meta.json."""

    backends: list[str] = field(default_factory=lambda: ["nccl"])
    world_sizes: list[int] = field(default_factory=lambda: [2])
    device: str = "cuda"
    ops: list[str] = field(default_factory=lambda: list(OPS))
    dtypes: list[str] = field(default_factory=lambda: ["fp32", "bf16"])
    min_bytes: int = 2**10
    max_bytes: int = 2**30
    factor: int = 2
    iters: int = 20
    warmup: int = 5
    budget_s: float = 0.2
    max_iters: int = 1000
    graph_max_bytes: int = 0
    reference: bool = True
    group_timeout_s: float = 600.0
    out: str = "results"

    def sizes(self) -> list[int]:
        return size_ladder(self.min_bytes, self.max_bytes, self.factor)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def config_from_args(args: argparse.Namespace, gpus: int) -> CommConfig:
    """Validate the flags; every bad value is a one-line UserError naming the value and the fix."""
    device = args.device or ("cuda" if gpus else "cpu")
    if device not in ("cpu", "cuda"):
        raise UserError(f"--device {device!r}: use cpu or cuda")
    backends = _csv(args.backends or registry.default_for(device).name, tuple(registry.names()), "--backends")
    for b in backends:
        if registry.get(b).unsupported(device):
            raise UserError(f"--backends {b} needs --device {'/'.join(sorted(registry.get(b).devices))}; "
                            f"use --backends {registry.default_for(device).name} on {device.upper()}")
    try:
        worlds = [int(x) for x in str(args.world_sizes or "2").split(",") if x.strip()]
    except ValueError:
        raise UserError(f"--world-sizes {args.world_sizes!r}: use a comma list of integers >= 2, e.g. 2,4") from None
    if not worlds or min(worlds) < 2:
        raise UserError(f"--world-sizes {args.world_sizes!r}: collectives need at least 2 ranks, e.g. 2,4")
    if device == "cpu" and max(worlds) > 4 * cpu_threads():
        raise UserError(f"--world-sizes {max(worlds)}: more ranks than 4 x {cpu_threads()} CPU threads on this host "
                        f"(they would crawl or hang); use at most {4 * cpu_threads()} here, e.g. --world-sizes 2,4")
    if device == "cuda" and max(worlds) > gpus:
        raise UserError(f"--world-sizes {max(worlds)} needs {max(worlds)} GPUs, {gpus} visible; "
                        "lower it or use --device cpu")
    # a flag given empty is refused, not read as left out (a shell variable that expanded to nothing)
    lo = parse_bytes("1K" if args.min_bytes is None else args.min_bytes, "--min-bytes")
    hi = parse_bytes(("1G" if device == "cuda" else "16M") if args.max_bytes is None else args.max_bytes,
                     "--max-bytes")
    if lo < 4 or hi < lo:
        raise UserError(f"--min-bytes {lo} / --max-bytes {hi}: need 4 <= min <= max, e.g. 1K and 1G")
    check_memory(hi, max(worlds), device, args.max_bytes)
    if args.factor not in (2, 4):
        raise UserError(f"--factor {args.factor}: use 2 or 4")
    for flag, v in (("--iters", args.iters), ("--warmup", args.warmup)):
        if v is not None and v < (1 if flag == "--iters" else 0):
            raise UserError(f"{flag} {v}: use a positive number (default 20 iters, 5 warm-up)")
    cfg = CommConfig(backends=backends, world_sizes=sorted(set(worlds)), device=device,
                     ops=_csv(",".join(OPS) if args.ops is None else args.ops, OPS, "--ops"),
                     dtypes=_csv("fp32,bf16" if args.dtypes is None else args.dtypes, tuple(DTYPES), "--dtypes"),
                     min_bytes=lo, max_bytes=hi, factor=args.factor, out=args.out or "results",
                     graph_max_bytes=parse_bytes("0" if args.graph_max_bytes is None else args.graph_max_bytes,
                                                 "--graph-max-bytes"),
                     reference=not args.no_reference)
    if args.iters is not None:
        cfg.iters = args.iters
    if args.warmup is not None:
        cfg.warmup = args.warmup
    if args.timeout is not None:
        if args.timeout <= 0:
            raise UserError(f"--timeout {args.timeout}: use a positive number of seconds, e.g. 300")
        cfg.group_timeout_s = args.timeout
    if args.budget is not None:
        if not (0 <= args.budget <= BUDGET_MAX_S):
            raise UserError(f"--budget {args.budget:g}: use seconds per point from 0 (exactly --iters) to "
                            f"{BUDGET_MAX_S:g} (a point stops at {cfg.max_iters} calls), e.g. 0.2")
        cfg.budget_s = args.budget
    return cfg


#: The most seconds per point --budget takes: a point stops at max_iters calls whatever is left
BUDGET_MAX_S = 60.0

#: A point's buffers on one rank, in sizes S (nccl-tests' total array): all_to_all and send/recv
#: hold an input and an output of S each, and the correctness check fills and compares them.
BUFFERS_PER_RANK = 3


def check_memory(max_bytes: int, world: int, device: str, given: str | None) -> None:
    """Refuse a largest size whose buffers cannot fit: on CPU every rank of the largest world size
    shares this host's available memory; on CUDA each rank has its own GPU's. (--max-bytes 100G on CPU
    ran into the host's OOM killer.)"""
    need = BUFFERS_PER_RANK * max_bytes
    if device == "cpu":
        import psutil

        have, need, where = psutil.virtual_memory().available, need * world, f"{world} ranks on this host"
    else:
        import torch

        have, where = torch.cuda.get_device_properties(0).total_memory, "each rank's GPU"
    if need > 0.8 * have:
        flag = f"--max-bytes {given}" if given else f"the default --max-bytes ({max_bytes:,} B)"
        raise UserError(f"{flag} needs about {need / 2**30:.1f} GiB for {where} ({BUFFERS_PER_RANK} buffers of the "
                        f"size a rank); {have / 2**30:.1f} GiB there: lower --max-bytes, e.g. 16M on cpu, 1G on cuda")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_env(nproc: int) -> dict[str, str]:
    """The workers' environment, as bench.train.launcher builds it (not imported: that module pulls in
    every strategy, and the sweep needs none)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([p for p in sys.path if p] + [env.get("PYTHONPATH", "")])
    env.setdefault("OMP_NUM_THREADS", str(threads_per_rank(nproc)))
    env.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink SHARP multicast is off on the lent machines
    env.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    return env


def run_group(cfg: CommConfig, backend: str, world: int, work: Path) -> list[dict[str, Any]]:
    """One torchrun for (backend, world size); the rows rank 0 wrote, or one error row."""
    tag = f"{backend}-x{world}"
    plan = {"backend": backend, "device": cfg.device, "ops": cfg.ops, "dtypes": cfg.dtypes, "sizes": cfg.sizes(),
            "iters": cfg.iters, "warmup": cfg.warmup, "budget_s": cfg.budget_s, "max_iters": cfg.max_iters,
            "graph_max_bytes": cfg.graph_max_bytes, "reference": cfg.reference,
            "pg_timeout_s": cfg.group_timeout_s, "out": str(work / f"{tag}.json")}
    plan_path = work / f"{tag}-plan.json"
    plan_path.write_text(json.dumps(plan, indent=1))
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={world}", "--master-addr=127.0.0.1",
           f"--master-port={free_port()}", "--max-restarts=0", "-m", "bench.comm.worker", str(plan_path)]
    log = work / f"{tag}.log"
    with open(log, "w") as f:
        # its own session, so that a timeout or a stop signal takes torchrun and its ranks down together
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=child_env(world), start_new_session=True)
        try:
            rc: int | str = proc.wait(timeout=cfg.group_timeout_s)
        except subprocess.TimeoutExpired:
            _stop_group(proc, str(plan_path))
            rc = "timeout"
        except BaseException:
            _stop_group(proc, str(plan_path))
            raise
    rows = json.loads(Path(plan["out"]).read_text()) if Path(plan["out"]).is_file() else []
    if rc != 0:
        tail = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()][-3:]
        rows.append({"kind": "sweep", "backend": backend, "device": cfg.device, "world_size": world,
                     **outcome("failed", f"group exited {rc}: {' | '.join(tail)[:300]}")})
    return rows


def _stop_group(proc: subprocess.Popen, plan_path: str, grace_s: float = 3.0) -> None:
    """SIGTERM, then SIGKILL after ``grace_s``, to torchrun's session, its descendants and every
    process whose command line names this group's plan (ranks that left the session): the run
    command's own :class:`bench.runtime.process.ProcessTree`."""
    from bench.runtime.process import ProcessTree

    ProcessTree(proc, plan_path).kill(grace_s)


def write_atomic(df: pd.DataFrame, path: Path) -> None:
    """Through a temporary file and a rename: a killed sweep leaves the last complete table."""
    tmp = path.with_name(f".{path.name}.tmp")
    df.to_parquet(tmp, index=False)
    os.replace(tmp, path)


def add_reference(df: pd.DataFrame) -> pd.DataFrame:
    """``reference_busbw_gbs`` on every row: the plain loop's busbw of the same backend, device,
    world size and dtype, and ``vs_reference`` = busbw / reference on the all_reduce rows."""
    df = df.copy()
    keys = ["backend", "device", "world_size", "dtype"]
    for col in (*keys, "kind", "op", "busbw_gbs"):  # a group that failed before its first result has one row
        if col not in df:                          # without them (a KeyError lost the whole table)
            df[col] = float("nan") if col == "busbw_gbs" else None
    ref = df[df["kind"] == "reference"].groupby(keys)["busbw_gbs"].max().rename("reference_busbw_gbs")
    df = df.join(ref, on=keys) if len(ref) else df.assign(reference_busbw_gbs=float("nan"))
    ar = (df["kind"] == "sweep") & (df["op"] == "all_reduce")
    df["vs_reference"] = (df["busbw_gbs"] / df["reference_busbw_gbs"]).where(ar)
    return df


def run_sweep(cfg: CommConfig) -> Path:
    """The whole sweep; returns the run folder (tables rewritten after every group)."""
    from bench.comm.model import fit
    from bench.measure.topology import topology
    from bench.results.store import new_run_id, write_meta
    from bench.results.folder import check_out

    check_out(cfg.out)  # an unwritable --out was a traceback
    run_dir = Path(cfg.out) / new_run_id()
    work = run_dir / "work"
    work.mkdir(parents=True)
    topo = topology()
    write_meta(run_dir, cfg.to_dict(), command="comm", topology=topo)
    rows: list[dict[str, Any]] = []
    try:
        for backend in cfg.backends:
            for world in cfg.world_sizes:
                rows.extend({"run_id": run_dir.name, **r} for r in run_group(cfg, backend, world, work))
                df = add_reference(pd.DataFrame(rows))
                write_atomic(df, run_dir / "collectives.parquet")
    except KeyboardInterrupt as e:  # a stop signal: the caller names the folder with the finished groups
        e.run_dir = run_dir  # type: ignore[attr-defined]
        raise
    ok = df[(df["status"] == "ok") & (df["kind"] == "sweep")] if "status" in df else df.iloc[:0]
    if len(ok):
        write_atomic(fit(ok).fits, run_dir / "comm_model.parquet")
    return run_dir


def summary_table(df: pd.DataFrame, sizes: tuple[int, ...] = (2**10, 2**20, 2**24, 2**28, 2**30)) -> str:
    """busbw (GB/s) by op at a few sizes, per backend/device/world/dtype; wrong counts; failures."""
    ok = df[(df.get("status") == "ok") & (df.get("kind") == "sweep")]
    lines = []
    if len(ok):
        pick = ok[ok["bytes"].isin(set(sizes) | {ok["bytes"].max()})]
        t = pick.pivot_table(index=["backend", "device", "world_size", "dtype", "op"], columns="bytes",
                             values="busbw_gbs", aggfunc="max")
        t.columns = [_human(int(c)) for c in t.columns]
        lines.append("busbw GB/s (nccl-tests definition):\n" + t.round(2).to_string())
        lat = ok[ok["bytes"] == ok["bytes"].min()].groupby(["backend", "world_size", "op"])["time_s"].min() * 1e6
        lines.append(f"latency at {_human(int(ok['bytes'].min()))} (us):\n" + lat.round(1).unstack("op").to_string())
        lines.append(f"wrong elements: {int(ok['wrong'].fillna(0).sum())} over {len(ok)} points")
    ref = df[df.get("kind") == "reference"]
    for _, r in ref.iterrows():
        top = ok[(ok["op"] == "all_reduce") & (ok["backend"] == r["backend"]) & (ok["world_size"] == r["world_size"])
                 & (ok["dtype"] == r["dtype"]) & (ok["bytes"] == r["bytes"])]
        mine = float(top["busbw_gbs"].max()) if len(top) else float("nan")
        lines.append(f"plain loop all_reduce {r['backend']} x{r['world_size']} {r['dtype']} {_human(int(r['bytes']))}: "
                     f"{r['busbw_gbs']:.1f} GB/s; sweep {mine:.1f} GB/s = {mine / r['busbw_gbs']:.3f} of it")
    bad = df[df.get("status") != "ok"] if "status" in df else df.iloc[:0]
    if len(bad):
        lines.append("not measured:\n" + bad.drop_duplicates(["backend", "world_size", "op", "status"])[
            ["backend", "world_size", "op", "status", "reason"]].to_string(index=False))
    return "\n".join(lines)


def _human(n: int) -> str:
    for unit, k in (("G", 2**30), ("M", 2**20), ("K", 2**10)):
        if n >= k and n % k == 0:
            return f"{n // k}{unit}"
    return str(n)


def cmd_comm(args: argparse.Namespace) -> int:
    """Handler of ``parbench comm``."""
    from bench.cli.common import install_stop_handlers, report_interrupt, restore_stop_handlers
    from bench.measure.hardware import gpu_count

    cfg = config_from_args(args, gpu_count())
    install_stop_handlers()  # Ctrl-C, SIGTERM, SIGHUP: the group's processes are stopped, finished groups kept
    try:
        run_dir = run_sweep(cfg)
    except KeyboardInterrupt as e:
        return report_interrupt(e, "the groups that finished")
    finally:
        restore_stop_handlers()
    print(summary_table(pd.read_parquet(run_dir / "collectives.parquet")))
    print(f"run folder: {run_dir}")
    df = pd.read_parquet(run_dir / "collectives.parquet")
    return 1 if df["wrong"].fillna(0).gt(0).any() else 0


def register(sub: Any) -> argparse.ArgumentParser:
    """Add the ``comm`` subparser to ``sub`` (from ``parser.add_subparsers``)."""
    p = sub.add_parser("comm", help="collective sweep: algbw/busbw per op, size, dtype, backend, world size")
    p.add_argument("--backends", help="comma list: nccl, gloo (default: nccl on cuda, gloo on cpu)")
    p.add_argument("--world-sizes", help="comma list of world sizes >= 2 (default 2)")
    p.add_argument("--device", choices=("cpu", "cuda"), help="tensor device (default: cuda when GPUs are visible)")
    p.add_argument("--ops", help=f"comma list of {', '.join(OPS)} (default: all)")
    p.add_argument("--dtypes", help="comma list of fp32, bf16 (default: both)")
    p.add_argument("--min-bytes", help="smallest size, e.g. 1K (default 1K)")
    p.add_argument("--max-bytes", help="largest size, e.g. 1G (default 1G on cuda, 16M on cpu)")
    p.add_argument("--factor", type=int, default=2, help="size step: 2 or 4 (default 2)")
    p.add_argument("--iters", type=int, help="timed calls per point, at least (default 20)")
    p.add_argument("--warmup", type=int, help="untimed calls per point (default 5)")
    p.add_argument("--budget", type=float, help="seconds per point: cheap points get more calls (default 0.2; 0 = "
                                                "exactly --iters)")
    p.add_argument("--graph-max-bytes", help="NCCL: replay sizes up to this from a CUDA graph (default 0 = off)")
    p.add_argument("--timeout", type=float, help="seconds one (backend, world size) group may take (default 600)")
    p.add_argument("--no-reference", action="store_true", help="skip the plain torch all_reduce loop")
    p.add_argument("--out", help="results folder (default: results)")
    p.set_defaults(func=cmd_comm)
    return p
