"""The `parbench` command: run | report | compare | history | export | comm | serve | slurm | list."""

from __future__ import annotations

import argparse
import logging
import re
import signal
import sys
from pathlib import Path
from typing import NoReturn

from bench import __version__

from bench.core.errors import UserError


def _add_run(sub) -> None:
    p = sub.add_parser("run", help="run a benchmark matrix and write results/<run-id>/")
    add_run_args(p)
    p.add_argument("--resume", metavar="RUN", help="finish the run folder RUN (killed or interrupted): run only the "
                                                   "cells it has no row for, with its own settings, appending to it")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_node_flags(p)


def add_run_args(p) -> None:
    """The matrix and measurement flags of `run` (`slurm` takes them too and passes them on)."""
    p.add_argument("--config", help="TOML file with any of the settings below (flags win)")
    p.add_argument("--workloads", help="comma list: mlp, convnet, gpt-tiny..gpt-200m, name[dim=N,...], "
                                       "or package.module:factory")
    p.add_argument("--strategies", help="comma list of strategies, or 'all' (default)")
    p.add_argument("--backends", help="comma list: nccl, gloo")
    p.add_argument("--world-sizes", help="comma list of world sizes, e.g. 1,2,4")
    p.add_argument("--device", help="cpu or cuda (default: cuda when GPUs are visible)")
    p.add_argument("--steps", type=int, help="timed steps per cell")
    p.add_argument("--warmup", type=int, help="untimed warm-up steps per cell")
    p.add_argument("--seed", type=int)
    p.add_argument("--precision", help="auto (bf16 on cuda, fp32 on cpu), fp32 or bf16")
    p.add_argument("--global-batch", type=int, help="override every workload's global batch")
    p.add_argument("--scaling", help="strong (default: the same global batch at every world size) or weak "
                                     "(the same batch per device: n devices train n x the global batch)")
    p.add_argument("--cell-timeout", dest="cell_timeout_s", type=float, help="seconds before a cell is a timeout")
    p.add_argument("--sample-hz", type=float, help="telemetry sampling rate, 0 = off (default 20, max 1000)")
    p.add_argument("--profile-steps", type=int,
                   help="steps profiled after the timed ones for the compute/comm breakdown (default 2; 0 = off)")
    p.add_argument("--profile-at", choices=("auto", "end", "inline"),
                   help="when the profiled steps run: end (after every timed step of the process group, in a "
                        "pass that builds each cell again: no timed step follows a GPU profiler session), inline "
                        "(right after each cell's first timed repeat), auto (default: end on cuda, inline on cpu)")
    p.add_argument("--trace", action="store_true", default=None,
                   help="keep each rank's Chrome trace (opens in Perfetto) under RUN/traces/")
    p.add_argument("--repeats", type=int,
                   help="measure each cell N times, in rounds ordered by a balanced Latin square (default 1)")
    p.add_argument("--budget", help="time budget for the whole run, e.g. 10m: repeats, steps and caps are "
                                    "planned to fit (GPU default 10m; 'off' for none)")
    p.add_argument("--warmup-max", type=int, help="warm-up continues until the step time settles, up to this "
                                                   "(default 4 x --warmup)")
    p.add_argument("--steps-max", type=int, help="timed steps continue until --target-ci, up to this "
                                                  "(default 3 x --steps)")
    p.add_argument("--target-ci", type=float, help="relative half-width of the median's 95%% interval to reach "
                                                   "(default 0.02; 0 = fixed step count)")
    p.add_argument("--time-cap", dest="time_cap_s", type=float,
                   help="seconds of timed steps after which no more are added; the adaptive warm-up adds "
                        "no more after half of it (default 20)")
    p.add_argument("--option", action="append", metavar="KEY=VALUE", default=[],
                   help="strategy option, repeatable: mesh=2x2, micro_batches=8, bucket_mb=25")
    p.add_argument("--out", help="results folder (default: results)")
    p.add_argument("--report", action="store_true", help="also write the HTML report into the run folder")


def add_node_flags(p) -> None:
    """The multi-node flags of `run` (docs/MULTINODE.md)."""
    p.add_argument("--nnodes", type=int, help="machines the run spans, each running this command (default 1)")
    p.add_argument("--node-rank", dest="node_rank", type=int,
                   help="this machine's rank, 0..nnodes-1; node 0 hosts the rendezvous and writes the tables")
    p.add_argument("--rdzv-endpoint", dest="rdzv_endpoint", metavar="HOST:PORT",
                   help="node 0's address for torchrun's c10d rendezvous (default 127.0.0.1:29400, loopback)")
    p.add_argument("--rdzv-timeout", dest="rdzv_timeout_s", type=float,
                   help="seconds to wait for every node to join (default 300)")


def parse_options(items: list[str]) -> dict[str, object]:
    """['mesh=2x2', 'micro_batches=8'] -> {'mesh': '2x2', 'micro_batches': 8}."""
    out: dict[str, object] = {}
    for item in items:
        key, eq, val = item.partition("=")
        if not eq or not key.strip():
            raise UserError(f"option {item!r} must be KEY=VALUE, e.g. --option micro_batches=8")
        val = val.strip()
        try:
            out[key.strip()] = int(val)
        except ValueError:
            try:
                out[key.strip()] = float(val)
            except ValueError:
                out[key.strip()] = val
    return out


#: Signals that stop a run like Ctrl-C: a CI cancel or `timeout` sends SIGTERM, a closed terminal SIGHUP.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def install_stop_handlers() -> None:
    """SIGTERM and SIGHUP stop the run as SIGINT does (the launcher kills its process trees, keeps
    the finished cells and writes meta.json); a second signal during that cleanup is ignored."""
    from bench.runtime.signals import Interrupted, request_stop

    def handler(signum, _frame):
        for s in STOP_SIGNALS:
            signal.signal(s, signal.SIG_IGN)
        if not request_stop(signum):  # inside a group the launcher raises it at a safe point
            raise Interrupted(signum)

    for s in STOP_SIGNALS:
        signal.signal(s, handler)


def restore_stop_handlers() -> None:
    for s in STOP_SIGNALS:
        signal.signal(s, signal.SIG_DFL if s != signal.SIGINT else signal.default_int_handler)


def report_interrupt(e: KeyboardInterrupt, kept: str, then: str = "") -> int:
    """The one line for a stopped command (run, serve, comm): which signal, and where what finished
    is (``e.run_dir``, set by the command's run function), then ``then`` with ``{where}`` filled in;
    the exit code is 128 + the signal."""
    signum = getattr(e, "signum", signal.SIGINT)
    where = getattr(e, "run_dir", None)
    print(f"interrupted by {signal.Signals(signum).name}: "
          + (f"{kept} are in {where}" + then.format(where=where) if where else "no run folder was started yet"),
          file=sys.stderr)
    return 128 + signum


def check_gpus(cfg, gpus: int) -> None:
    """A GPU run on a machine without GPUs is an error, not a run of nothing that exits 0."""
    if gpus > 0:
        return
    if cfg.device == "cuda":
        raise UserError("--device cuda: no GPU visible; use --device cpu (with --backends gloo)")
    if "nccl" in cfg.backends:
        raise UserError("--backends nccl: no GPU visible (NCCL needs CUDA); use --backends gloo")


def resumed_config(run_dir: str, gpus: int):
    """The settings of the run folder ``run_dir`` (its meta.json), for ``--resume``: the plan, and so
    the cell ids, are the original's."""
    from bench.core.config import RunConfig, validate
    from bench.results.store import load_meta

    d = Path(run_dir)
    if not d.is_dir() or not (d / "meta.json").is_file():
        raise UserError(f"--resume {run_dir!r} is not a parbench run folder (no meta.json); pass results/<run-id>")
    config = load_meta(d).get("config")
    if not isinstance(config, dict) or not config:
        raise UserError(f"--resume {run_dir!r}: meta.json has no config; run it again instead")
    # a run from before the profile pass profiled inline: its resumed cells keep that order
    config = {"profile_at": "inline" if config.get("profile_steps", 2) else "auto", **config}
    try:
        return validate(RunConfig(**config))
    except TypeError as e:
        raise UserError(f"--resume {run_dir!r}: its config is from another parbench version ({e}); "
                        "run it again instead") from None


def cmd_run(args) -> int:
    from bench.train import launcher as launch
    from bench.core.config import build_config, load_toml
    from bench.measure.hardware import gpu_count

    gpus = gpu_count()
    flags = {k: getattr(args, k) for k in ("workloads", "strategies", "backends", "world_sizes", "device",
                                           "steps", "warmup", "seed", "precision", "global_batch",
                                           "cell_timeout_s", "out", "sample_hz", "scaling", "repeats", "budget",
                                           "warmup_max", "steps_max", "target_ci", "time_cap_s",
                                           "profile_steps", "profile_at", "trace", "nnodes", "node_rank",
                                           "rdzv_endpoint", "rdzv_timeout_s")}
    if args.resume:
        given = [k for k, v in flags.items() if v is not None] + (["option"] if args.option else []) \
            + (["config"] if args.config else [])
        if given:
            raise UserError(f"--resume takes the run's own settings; drop --{given[0].replace('_', '-')}")
        cfg = resumed_config(args.resume, gpus)
    else:
        toml = load_toml(args.config) if args.config else {}
        if args.option:
            flags["options"] = {**toml.get("options", {}), **parse_options(args.option)}
        cfg = build_config(toml=toml, flags=flags, gpus=gpus)
    check_gpus(cfg, gpus)
    from bench.cli.progress import MatrixProgress

    install_stop_handlers()
    from bench.multinode import NodeLost

    try:
        with MatrixProgress(enabled=not args.no_progress and cfg.node_rank == 0) as bar:
            run_dir = launch.run(cfg, gpus, on_progress=bar, resume=Path(args.resume) if args.resume else None)
    except NodeLost as e:
        print(f"parbench: node {cfg.node_rank}: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as e:
        return report_interrupt(e, "the cells that finished", "; finish it with parbench run --resume {where}")
    finally:
        restore_stop_handlers()
    if cfg.node_rank > 0:
        print(f"node {cfg.node_rank}: done; node 0 wrote the tables (this node's logs: {run_dir})")
        return 0
    from bench.cli.summary import print_summary

    print_summary(run_dir)
    print_recommendation(run_dir)
    print_budget_use(run_dir)
    if args.report:
        from reports import build_report

        print(f"report: {build_report(run_dir)}")
    return 0


def print_budget_use(run_dir: Path) -> None:
    """One line after a budgeted run: this invocation's time against the budget (a resumed run got
    the budget afresh), what the deadline cut, and what the process groups' start-ups cost
    (meta.json ``group_starts``). Best effort: a meta.json it cannot read gives no line."""
    import json
    from datetime import datetime

    from bench.core.config import parse_duration
    from bench.results.store import load_run

    try:
        meta = json.loads((run_dir / "meta.json").read_text())
        budget = (meta.get("config") or {}).get("budget")
        if not budget:
            return
        budget_s = parse_duration(budget)
        end = datetime.fromisoformat(meta["updated_utc"]).timestamp()
        start = meta.get("invoked_unix") or datetime.fromisoformat(meta["created_utc"]).timestamp()
        took = end - float(start)
        starts = [g for g in meta.get("group_starts") or [] if g.get("launched_unix", start) >= start]
        start_s = sum(float(g.get("start_s") or 0.0) for g in starts)
        cells, _, _ = load_run(run_dir)
        cut = int((cells["status"].eq("skipped") & cells["reason"].fillna("").str.startswith("time budget")).sum())
        done = int(cells["status"].isin(["ok", "failed", "timeout"]).sum())
    except Exception:  # noqa: BLE001 - a summary line, never a reason for the finished run to fail
        return
    print(f"budget {budget}: the run took {took:.0f} s ({took / budget_s:.0%})"
          + (" since its resume" if meta.get("resumed") is not None else "")
          + f"; {done} cells measured, {cut} cut by the deadline; {len(starts)} process group start-ups took "
          f"{start_s:.0f} s")


def print_recommendation(run_dir: Path) -> None:
    """The report's first screen, as lines at the end of `parbench run` (plain text, never markup)."""
    from rich.console import Console
    from rich.text import Text

    from bench.results.store import load_run
    from reports.recommend import recommend

    cells, _, _ = load_run(run_dir)
    if "mode" in cells:
        cells = cells[cells["mode"] != "serve"]
    picks = recommend(cells)
    console = Console(width=None if Console().is_terminal else 150)
    console.print(Text("recommendation:" if picks else "recommendation: no strategy on more than one device passed"))
    for p in picks:
        console.print(Text(f"  {p.line()}"), soft_wrap=True)


def cmd_report(args) -> int:
    from reports import build_report

    if args.output and Path(args.output).exists() and not Path(args.output).is_dir():
        raise UserError(f"-o {args.output!r} is an existing file; the report is a folder: pass a new or existing "
                        "folder name")
    if args.baseline and args.history:
        raise UserError("give --baseline RUN or --history DIR, not both")
    for flag, path in (("--baseline", args.baseline), ("--history", args.history)):
        if path and not Path(path).is_dir():
            raise UserError(f"{flag} {path!r} is not a folder; pass a run folder (--baseline) or a history store "
                            "(--history)")
    out = build_report(Path(args.run_dir), Path(args.output) if args.output else None,
                       baseline=Path(args.baseline) if args.baseline else None,
                       history=Path(args.history) if args.history else None)
    print(out)
    return 0


def cmd_list(args) -> int:
    import strategies
    from bench import workloads

    print("workloads:")
    for n in workloads.names():
        print(f"  {n:<20} {workloads.resolve(n).description}")
    print("  package.module:factory  your own: a factory returning bench.workloads.Workload")
    print("strategies:")
    for n, cls in strategies.REGISTRY.items():
        print(f"  {n:<20} {cls.summary}\n  {'':<20} needs: {cls.needs}")
    return 0


_ARGV: list[str] = []  # the command line being parsed (for the hint in _Parser.error)


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (its own print the whole usage first); the subcommands' parsers
    are of this class too (add_subparsers makes its parsers of the parent's class)."""

    def error(self, message: str) -> NoReturn:  # type: ignore[override]
        flags = message.split(":")[0].removeprefix("argument ").split("/")
        if "expected one argument" in message:
            after = [_ARGV[i + 1] for i, a in enumerate(_ARGV[:-1]) if a in flags]
            if any(re.fullmatch(r"-\d.*", a) for a in after):  # the value was read as a flag
                message += f" (a value that starts with '-' goes as {flags[-1]}=VALUE)"
        self.exit(2, f"{self.prog}: error: {message}; see {self.prog} -h\n")


def _chosen(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The innermost subcommand parser that ``args`` went through (``parbench history show``)."""
    while True:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        name = getattr(args, subs[0].dest, None) if subs else None
        if not subs or name not in subs[0].choices:
            return parser
        parser = subs[0].choices[name]


def main(argv: list[str] | None = None) -> int:
    parser = _Parser(prog="parbench", description=__doc__)
    parser.add_argument("--version", action="version", version=f"parbench {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    _add_run(sub)
    p = sub.add_parser("report", help="HTML + PNG report of a run folder")
    p.add_argument("run_dir")
    p.add_argument("-o", "--output", help="output folder (default: RUN_DIR/report)")
    p.add_argument("--baseline", help="add the statistical comparison with this run (regressions first)")
    p.add_argument("--history", help="add the comparison with this history store's last stable values")
    sub.add_parser("list", help="workloads and strategies, with what each needs")
    from bench.cli import comm as cli_comm
    from bench.cli import gate as cli_regress
    from bench.cli import serve as cli_serve
    from bench.cli import slurm as cli_slurm

    cli_comm.register(sub)
    cli_regress.register(sub)  # compare, history, export
    cli_serve.register(sub)
    cli_slurm.register(sub)
    _ARGV[:] = list(sys.argv[1:] if argv is None else argv)
    args, rest = parser.parse_known_args(argv)
    if rest:  # named by the (sub)command that was given, with its help (argparse names the top level)
        _chosen(parser, args).error(f"unrecognized arguments: {' '.join(rest)}")
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(message)s")
    handlers = {"run": cmd_run, "report": cmd_report, "list": cmd_list, "comm": cli_comm.cmd_comm}
    try:
        if args.cmd in handlers:
            return handlers[args.cmd](args)
        return args.func(args)
    except UserError as e:
        print(f"parbench: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
