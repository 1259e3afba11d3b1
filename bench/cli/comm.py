"""``parbench comm``: the collective sweep's flags; :mod:`bench.comm.sweep` runs it.

Exit codes: 0 every point measured and correct; 1 a group failed (a rank died, raised or hung past
--timeout: the points it measured before are kept, its failure row says why, one line on stderr
names it) or a point was wrong; 2 bad input; 128 + the signal when stopped (130 Ctrl-C, 143
SIGTERM: the groups that finished are kept, one line names the run folder).

The sweep writes ``<out>/<run-id>/collectives.parquet`` (one row per op, dtype, size, backend and world size,
plus ``kind == 'reference'`` rows: a plain torch all_reduce loop at the largest size), the fitted
alpha-beta model ``comm_model.parquet`` and ``meta.json`` (with the NVML topology).
"""

from __future__ import annotations

import argparse
import re
import sys
from typing import TYPE_CHECKING, Any

from bench.comm.ops import DTYPE_NAMES, OPS
from bench.core import backends as registry
from bench.core.errors import UserError
from bench.measure.hardware import cpu_threads

if TYPE_CHECKING:
    from bench.comm.sweep import CommConfig

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


def config_from_args(args: argparse.Namespace, gpus: int) -> CommConfig:
    """Validate the flags; every bad value is a one-line UserError naming the value and the fix."""
    from bench.comm.sweep import CommConfig

    device = args.device or ("cuda" if gpus else "cpu")
    if device not in ("cpu", "cuda"):
        raise UserError(f"--device {device!r}: use cpu or cuda")
    # a flag given empty is refused, not read as left out (a shell variable that expanded to nothing)
    backends = _csv(registry.default_for(device).name if args.backends is None else args.backends,
                    tuple(registry.names()), "--backends")
    for b in backends:
        if registry.get(b).unsupported(device):
            raise UserError(f"--backends {b} needs --device {'/'.join(sorted(registry.get(b).devices))}; "
                            f"use --backends {registry.default_for(device).name} on {device.upper()}")
    try:
        worlds = [int(x) for x in str("2" if args.world_sizes is None else args.world_sizes).split(",") if x.strip()]
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
    lo = parse_bytes("1K" if args.min_bytes is None else args.min_bytes, "--min-bytes")
    hi = parse_bytes(("1G" if device == "cuda" else "16M") if args.max_bytes is None else args.max_bytes,
                     "--max-bytes")
    if lo < 4 or hi < lo:
        raise UserError(f"--min-bytes {lo} / --max-bytes {hi}: need 4 <= min <= max, e.g. 1K and 1G")
    check_memory(hi, max(worlds), device, args.max_bytes)
    if args.factor not in (2, 4):
        raise UserError(f"--factor {args.factor}: use 2 or 4")
    for flag, v in (("--iters", args.iters), ("--warmup", args.warmup)):
        if v is not None and not (1 if flag == "--iters" else 0) <= v <= CALLS_MAX:
            raise UserError(f"{flag} {v}: use a number of calls from {1 if flag == '--iters' else 0} to {CALLS_MAX:,} "
                            "per point (default 20 iters, 5 warm-up)")
    cfg = CommConfig(backends=backends, world_sizes=sorted(set(worlds)), device=device,
                     ops=_csv(",".join(OPS) if args.ops is None else args.ops, OPS, "--ops"),
                     dtypes=_csv("fp32,bf16" if args.dtypes is None else args.dtypes, DTYPE_NAMES, "--dtypes"),
                     min_bytes=lo, max_bytes=hi, factor=args.factor, out=_out(args.out),
                     graph_max_bytes=parse_bytes("0" if args.graph_max_bytes is None else args.graph_max_bytes,
                                                 "--graph-max-bytes"),
                     reference=not args.no_reference)
    if args.iters is not None:
        cfg.iters = args.iters
        cfg.max_iters = max(cfg.max_iters, args.iters)  # --iters is the least a point gets, never cut
    if args.warmup is not None:
        cfg.warmup = args.warmup
    if args.timeout is not None:
        if not 0 < args.timeout <= TIMEOUT_MAX_S:
            raise UserError(f"--timeout {args.timeout:g}: use a positive number of seconds up to {TIMEOUT_MAX_S:g}, "
                            "e.g. 300")
        cfg.group_timeout_s = args.timeout
    if args.budget is not None:
        if not (0 <= args.budget <= BUDGET_MAX_S):
            raise UserError(f"--budget {args.budget:g}: use seconds per point from 0 (exactly --iters) to "
                            f"{BUDGET_MAX_S:g} (a point stops at {cfg.max_iters} calls), e.g. 0.2")
        cfg.budget_s = args.budget
    return cfg


def _out(out: str | None) -> str:
    if out is not None and not out.strip():
        raise UserError(f"--out {out!r} is empty; pass a folder, e.g. --out results")
    return "results" if out is None else out


#: The most timed or warm-up calls per point (--iters, --warmup): more runs a small size for hours.
CALLS_MAX = 100_000
#: The longest --timeout: a day (the ranks' process-group timeout is set from it, and a longer
#: deadline overflows the platform's timers).
TIMEOUT_MAX_S = 86400.0

#: The most seconds per point --budget takes: a point stops at max_iters calls whatever is left
BUDGET_MAX_S = 60.0

#: A point's buffers on one rank, in sizes S (nccl-tests' total array): all_to_all and send/recv
#: hold an input and an output of S each, and the correctness check fills and compares them.
BUFFERS_PER_RANK = 3


def check_memory(max_bytes: int, world: int, device: str, given: str | None) -> None:
    """Refuse a largest size whose buffers cannot fit: on CPU every rank of the largest world size
    shares this host's available memory (past it the host's OOM killer ends the sweep); on CUDA each
    rank has its own GPU's."""
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


def cmd_comm(args: argparse.Namespace) -> int:
    """Handler of ``parbench comm``."""
    from bench.cli.common import install_stop_handlers, report_interrupt, restore_stop_handlers
    from bench.comm.sweep import run_sweep
    from bench.measure.hardware import gpu_count

    cfg = config_from_args(args, gpu_count())
    run_dir = None
    install_stop_handlers()  # Ctrl-C, SIGTERM, SIGHUP: the group's processes are stopped, finished groups kept
    try:
        run_dir = run_sweep(cfg, on_group=_progress)
        return _report(run_dir)
    except KeyboardInterrupt as e:  # also while the report prints: the run folder is complete then
        if getattr(e, "run_dir", None) is None:
            e.run_dir = run_dir  # type: ignore[attr-defined]
        return report_interrupt(e, "the groups that finished")
    finally:
        restore_stop_handlers()


def _progress(group: Any, rows: list[dict[str, Any]] | None, done: bool) -> None:
    """One line on stdout as a group starts, as each of its ops is measured, and as it ends."""
    tag = f"{group.backend} x{group.world_size}"
    if rows is None:
        points = len(group.ops) * len(group.dtypes) * len(group.sizes)
        print(f"{tag}: measuring {points} points", flush=True)
        return
    measured = sum(r.get("status") == "ok" and r.get("kind") == "sweep" for r in rows)
    if not done:
        last = rows[-1].get("op") if rows else "?"
        print(f"{tag}: {last} done, {measured} points so far", flush=True)
        return
    failed = [r for r in rows if r.get("status") == "failed"]
    print(f"{tag}: {measured} points measured" + (f"; failed: {failed[0].get('reason')}" if failed else ""),
          flush=True)


def _report(run_dir: Any) -> int:
    """The summary and the run folder on stdout; exit 1 with one line on stderr when a group failed
    or a point was wrong, else 0."""
    import pandas as pd

    from bench.comm.sweep import summary_table

    df = pd.read_parquet(run_dir / "collectives.parquet")
    print(summary_table(df))
    print(f"run folder: {run_dir}")
    failed = df[df["status"] == "failed"] if "status" in df else df.iloc[:0]
    wrong = int(df["wrong"].fillna(0).sum()) if "wrong" in df else 0
    if len(failed):
        r = failed.iloc[0]
        print(f"parbench: comm: {r['backend']} x{r['world_size']} failed: {r['reason']}; the points measured "
              f"before are in {run_dir / 'collectives.parquet'}", file=sys.stderr)
    elif wrong:
        print(f"parbench: comm: {wrong} wrong elements in the correctness checks; see the wrong column of "
              f"{run_dir / 'collectives.parquet'}", file=sys.stderr)
    return 1 if len(failed) or wrong else 0


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
