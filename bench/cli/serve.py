"""``parbench serve``: the serving benchmark (docs/guides/serving.md).

The subparser sets ``func=cmd_serve``.
Also runnable alone (the device script uses this): ``python -m bench serve --device cuda ...``.
Exit codes: 0 every cell ok and parity held, 1 a cell failed or parity broke (one line on stderr
names the first), 2 bad input, 128 + the signal when stopped (130 Ctrl-C, 143 SIGTERM: the cells
that finished keep their rows, and one line names the run folder).
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from typing import Any

from bench.core.errors import UserError
from bench.core.text import counted


def _floats(text: str | None, flag: str) -> list[float]:
    if text is None:
        return []
    if not text.strip(", "):  # given but empty: a shell variable that expanded to nothing
        raise UserError(f"{flag} {text!r} is empty: give a comma list of numbers, e.g. {flag} 10,40,80")
    try:
        vals = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UserError(f"{flag} {text!r} must be a comma list of numbers, e.g. 10,40,80") from None
    if not all(math.isfinite(v) for v in vals):
        raise UserError(f"{flag} {text!r} must be finite numbers, e.g. 10,40,80")
    return vals


def _ints(text: str | None, flag: str) -> list[int]:
    vals = _floats(text, flag)
    if any(v != int(v) for v in vals):
        raise UserError(f"{flag} {text!r} must be a comma list of whole numbers, e.g. 2,4")
    return [int(v) for v in vals]


def _csv(text: str | None) -> list[str]:
    return [x.strip() for x in (text or "").split(",") if x.strip()]


def _workload(text: str) -> tuple[str, dict[str, int]]:
    """``gpt-tiny[d_model=128,n_layer=4]`` -> ('gpt-tiny', {...})."""
    m = re.fullmatch(r"\s*([^\[\]]+?)\s*(?:\[(.*)\])?\s*", text)
    if not m:
        raise UserError(f"--workload {text!r} must be NAME or NAME[dim=N,...], e.g. gpt-tiny[n_layer=4]")
    dims: dict[str, int] = {}
    for kv in _csv(m.group(2)):
        k, eq, v = kv.partition("=")
        if not eq or not v.strip().lstrip("-").isdigit():
            raise UserError(f"--workload dimension {kv!r} must be name=integer, e.g. n_layer=4")
        dims[k.strip()] = int(v)
    return m.group(1), dims


def _slow(text: str | None) -> dict[int, float]:
    out: dict[int, float] = {}
    for kv in _csv(text):
        k, eq, v = kv.partition("=")
        try:
            out[int(k)] = float(v) / 1e3
        except ValueError:
            raise UserError(f"--slow {kv!r} must be PROCESS=MS, e.g. --slow 1=20 (process 1 +20 ms a batch)") from None
    return out


def config_from_args(args: argparse.Namespace, gpus: int) -> Any:
    """A checked :class:`ServeConfig` from the parsed flags."""
    from bench.serve.config import ServeConfig, tenants_from
    from bench.serve.loadgen import CV_MAX, CV_MIN, Tenant

    device = args.device or ("cuda" if gpus else "cpu")
    if device == "cuda" and not gpus:
        raise UserError("--device cuda but no GPU is visible; use --device cpu")
    wl, dims = _workload(args.workload)
    default = Tenant(name="t0", arrival=args.arrival, cv=args.cv, size=args.size, size_min=args.size_min,
                     size_max=args.size_max if args.size_max else args.size_min)
    if not args.tenants:  # the flags make the one tenant: name the flags, not "tenant t0"
        if default.size_min < 1:
            raise UserError(f"--size-min {args.size_min} must be >= 1, e.g. --size-min 16")
        if not default.size_min <= default.size_max:
            raise UserError(f"--size-min {args.size_min} and --size-max {args.size_max}: need 1 <= --size-min "
                            f"<= --size-max, e.g. --size-min 16 --size-max 96")
        if not CV_MIN <= default.cv <= CV_MAX:
            raise UserError(f"--cv {args.cv} must be from {CV_MIN:g} to {CV_MAX:g} (gamma arrivals; 1 is Poisson), "
                            "e.g. --cv 3")
    rates = _floats(args.rates, "--rates")
    clients = _ints(args.clients, "--clients")
    cfg = ServeConfig(
        workload=wl, dims=dims, task=args.task, gen_tokens=args.gen_tokens,
        placements=_csv(args.placements), policies=_csv(args.policies or "round-robin,jsq"),
        world_sizes=_ints(args.world_sizes, "--world-sizes") or [min(2, gpus) if device == "cuda" else 2],
        device=device, precision=args.precision, seed=args.seed, rates=rates if (rates or clients) else [20.0],
        clients=clients, tenants=tenants_from(args.tenants, default), duration_s=args.duration,
        max_requests=args.requests, batch_max=args.batch_max, batch_wait_ms=args.batch_wait_ms,
        slo_ms=args.slo_ms, sweep_rates=_floats(args.sweep_rates, "--sweep-rates"), noisy=args.noisy,
        noisy_rates=tuple(_floats(args.noisy_rates, "--noisy-rates") or [5.0, 50.0]),  # type: ignore[arg-type]
        slow=_slow(args.slow), parity=not args.no_parity, graphs=args.graphs, sample_hz=args.sample_hz,
        cell_timeout_s=args.cell_timeout, workload_timeout_s=args.workload_timeout, out=args.out)
    if len(cfg.noisy_rates) != 2:
        raise UserError(f"--noisy-rates {args.noisy_rates!r} must be VICTIM,FLOOD requests per second, e.g. 5,50")
    if args.noisy_rates is not None and not args.noisy:
        raise UserError(f"--noisy-rates {args.noisy_rates} sets the noisy-neighbour cells, which run with --noisy "
                        "only: add --noisy or drop --noisy-rates")
    if args.policies is not None and not _csv(args.policies):
        raise UserError(f"--policies {args.policies!r} is empty: give a comma list, e.g. --policies round-robin,jsq")
    if args.policies is not None and "replicas" not in cfg.placements:
        raise UserError(f"--policies {args.policies} balances the replicas placement only, and --placements "
                        f"{args.placements} has none: add replicas to --placements or drop --policies")
    cfg.check()
    from bench.results.folder import check_out

    if not cfg.out.strip():
        raise UserError(f"--out {cfg.out!r} is empty; pass a folder, e.g. --out results")
    check_out(cfg.out)  # before the model is built: an unwritable --out fails in one line, at once
    return cfg


def cmd_serve(args: argparse.Namespace) -> int:
    """Handler of ``parbench serve``."""
    from bench.cli.common import install_stop_handlers, report_interrupt, restore_stop_handlers
    from bench.measure.hardware import gpu_count
    from bench.serve import run as serve_run

    cfg = config_from_args(args, gpu_count())
    rows: list[dict[str, Any]] = []

    def on_cell(row: dict[str, Any]) -> None:
        rows.append(row)
        print(serve_run.summary_lines([row])[0], flush=True)

    def on_pool(placement: str, world: int) -> None:
        print(f"{placement} ws{world}: starting {counted(world, 'device')}", flush=True)

    run_dir = None
    install_stop_handlers()  # Ctrl-C, SIGTERM, SIGHUP: the pools are stopped and what finished is kept
    try:
        run_dir = serve_run.run(cfg, on_cell=on_cell, on_pool=on_pool)
        return _report(run_dir, rows)
    except KeyboardInterrupt as e:  # also while the report prints: the run folder is complete then
        if getattr(e, "run_dir", None) is None:
            e.run_dir = run_dir  # type: ignore[attr-defined]
        return report_interrupt(e, "the cells that finished")
    finally:
        restore_stop_handlers()


def _report(run_dir: Any, rows: list[dict[str, Any]]) -> int:
    """The run folder and the sweep's findings on stdout; one line on stderr when a cell failed or
    parity broke (exit 1), else exit 0."""
    from bench.results.run import load_meta
    from bench.stats.parity import PARITY_TOL

    print(f"run folder: {run_dir}")
    sweep = load_meta(run_dir).get("serve_sweep") or {}
    for key, found in sweep.items():
        best = found["max_rate_rps"]
        print(f"sweep {key}: highest offered rate meeting p99 <= {found['slo_p99_s'] * 1e3:g} ms: "
              + (f"{best:g} req/s" if best is not None else f"none ({found.get('note') or 'no rate met it'})"))
    bad = [r for r in rows if r["status"] not in ("ok", "skipped")]
    tol = PARITY_TOL.get(rows[0]["precision"], 1e-5) if rows else 1e-5
    broken = [r for r in rows if r.get("parity_rel_err") is not None and not r["parity_rel_err"] <= tol]
    if bad:
        r = bad[0]
        print(f"parbench: serve: {len(bad)} of {len(rows)} cells failed, the first {r['strategy']} ws{r['world_size']} "
              f"{r['serve_policy']} {r['serve_load']}: {r['reason']}; rows in {run_dir}", file=sys.stderr)
    elif broken:
        r = broken[0]
        print(f"parity: {r['strategy']} differs from one device by {r['parity_rel_err']:.2e} (> {tol:g})",
              file=sys.stderr)
    return 1 if bad or broken else 0


def register(sub: Any) -> argparse.ArgumentParser:
    """Add the ``serve`` subparser to ``sub`` (from ``parser.add_subparsers``)."""
    p = sub.add_parser("serve", help="serving benchmark: placements x balancing policies x load levels")
    p.add_argument("--workload", default="gpt-tiny", help="gpt-tiny..gpt-200m, convnet, NAME[dim=N,...] or "
                                                          "package.module:factory (default gpt-tiny)")
    p.add_argument("--task", default="auto", help="score (GPT prefill), generate (GPT, KV cache), classify; "
                                                  "auto: score for GPT, classify otherwise")
    p.add_argument("--gen-tokens", type=int, default=8, help="tokens generated per request (--task generate)")
    p.add_argument("--placements", default="replicas",
                   help="comma list: replicas, dataparallel-infer, pinned-tenants, pipeline (default replicas)")
    p.add_argument("--policies", default=None,
                   help="replicas only; comma list: round-robin, random, jsq, shared, batch "
                        "(default round-robin,jsq)")
    p.add_argument("--world-sizes", help="comma list of device counts (default 2; processes as devices on CPU)")
    p.add_argument("--device", choices=("cpu", "cuda"), help="default: cuda when GPUs are visible")
    p.add_argument("--precision", default="auto", help="auto (bf16 on cuda, fp32 on cpu), fp32 or bf16")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rates", help="open-loop load levels, total requests/s, comma list (default 20)")
    p.add_argument("--clients", help="closed-loop load levels: concurrent clients, comma list")
    p.add_argument("--arrival", default="poisson", help="poisson or gamma (bursty)")
    p.add_argument("--cv", type=float, default=3.0, help="gamma arrivals: coefficient of variation of the gaps")
    p.add_argument("--size", default="fixed", help="request sizes: fixed, uniform, pareto, lognormal")
    p.add_argument("--size-min", type=int, default=16, help="smallest request (GPT: prompt tokens; else rows)")
    p.add_argument("--size-max", type=int, default=0, help="largest request (default: --size-min; clipped to "
                                                           "what the model takes)")
    p.add_argument("--tenants", help="several tenants: 'a:rate=20,size=pareto;b:rate=5' (rates are ratios, "
                                     "scaled to each --rates level)")
    p.add_argument("--duration", type=float, default=5.0, help="seconds of arrivals per cell (default 5)")
    p.add_argument("--requests", type=int, default=0, help="requests per cell instead of --duration")
    p.add_argument("--batch-max", type=int, default=8, help="policy batch: most requests per batch (default 8)")
    p.add_argument("--batch-wait-ms", type=float, default=5.0, help="policy batch: longest wait for more (default 5)")
    p.add_argument("--slo-ms", type=float, default=0.0, help="p99 target: run the MLPerf Server rate sweep")
    p.add_argument("--sweep-rates", help="rates the sweep tries (default: doubling from the lowest --rates)")
    p.add_argument("--noisy", action="store_true", help="also run the noisy-neighbour cells")
    p.add_argument("--noisy-rates", help="VICTIM,FLOOD requests/s (default 5,50)")
    p.add_argument("--slow", help="make processes slow on purpose: 'PROCESS=MS,...' added per batch")
    p.add_argument("--no-parity", action="store_true", help="skip the parity probe")
    p.add_argument("--graphs", default="auto",
                   help="auto: CUDA replicas that score or classify replay their forward from CUDA graphs, "
                        "one per request shape (the host's kernel launches off the path); off: eager")
    p.add_argument("--sample-hz", type=float, default=10.0, help="telemetry rate, 0 = off")
    p.add_argument("--cell-timeout", type=float, default=600.0, help="seconds before a cell fails")
    p.add_argument("--workload-timeout", type=float, default=120.0,
                   help="seconds a package.module:factory workload may take to import and build (default 120)")
    p.add_argument("--out", default="results", help="results folder (default results)")
    p.set_defaults(func=cmd_serve)
    return p
