"""What several commands share: the run flags, option parsing, the parser class, stop signals."""

from __future__ import annotations

import argparse
import re
import signal
import sys
from typing import NoReturn

from bench.core import knobs
from bench.core.errors import UserError
from bench.runtime.signals import STOP_SIGNALS, install_stop_handlers, restore_stop_handlers  # noqa: F401 - the commands' import point


def table_console(width: int = 160):
    """A console for a wide table on stdout: the terminal's width on a terminal; elsewhere (a log,
    a pipe) COLUMNS when set, else ``width``."""
    import os

    from rich.console import Console

    if sys.stdout.isatty():
        return Console()
    cols = os.environ.get("COLUMNS", "")
    return Console(width=int(cols) if cols.isdigit() and int(cols) > 0 else width)


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
    p.add_argument("--global-batch", type=int, help="override every workload's global batch (the default "
                                                    "matrix's model sized beyond one GPU then stays out)")
    p.add_argument("--scaling", help="strong (default: the same global batch at every world size) or weak "
                                     "(the same batch per device: n devices train n x the global batch)")
    p.add_argument("--cell-timeout", dest="cell_timeout_s", type=float,
                   help="seconds from a cell's start before it is a timeout")
    p.add_argument("--startup-timeout", dest="startup_timeout_s", type=float,
                   help="seconds a process group may take to start (torchrun, imports, rendezvous, warm-up) "
                        "before its first cell (default 300)")
    p.add_argument("--workload-timeout", dest="workload_timeout_s", type=float,
                   help="seconds a package.module:factory workload may take to import and build while the run "
                        "is planned (default 120)")
    p.add_argument("--sample-hz", type=float, help="telemetry sampling rate, 0 = off (default 20, max 1000)")
    p.add_argument("--profile-steps", type=int,
                   help="steps profiled after the timed ones for the compute/comm breakdown (default 2; 0 = off)")
    p.add_argument("--profile-at", choices=("auto", "end", "inline"),
                   help="when the profiled steps run: end (after every timed step of the process group, in a "
                        "pass that builds each cell again: no timed step follows a GPU profiler session), inline "
                        "(right after each cell's first timed repeat), auto (default: end on cuda, inline on cpu)")
    p.add_argument("--no-adaptive", dest="adaptive", action="store_false", default=None,
                   help="under a budget, do not measure again the cells of decisions still open after one repeat")
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
    p.add_argument("--lr", type=float, help="learning rate (default: 1e-2 for sgd, 3e-4 for adam and adamw)")
    knobs.add_flags(p)
    p.add_argument("--option", action="append", metavar="KEY=VALUE", default=[],
                   help="strategy option, repeatable: mesh=2x2, micro_batches=8, bucket_mb=25")
    p.add_argument("--out", help="results folder (default: results)")
    p.add_argument("--report", action="store_true", help="also write the HTML report into the run folder")


def add_node_flags(p) -> None:
    """The multi-node flags of `run` (docs/guides/multinode.md)."""
    p.add_argument("--nnodes", type=int, help="machines the run spans, each running this command (default 1)")
    p.add_argument("--node-rank", dest="node_rank", type=int,
                   help="this machine's rank, 0..nnodes-1; node 0 hosts the rendezvous and writes the tables")
    p.add_argument("--rdzv-endpoint", dest="rdzv_endpoint", metavar="HOST:PORT",
                   help="node 0's address for torchrun's c10d rendezvous (default 127.0.0.1:29400, loopback)")
    p.add_argument("--rdzv-timeout", dest="rdzv_timeout_s", type=float,
                   help="seconds to wait for every node to join (default 300)")


def run_settings(args) -> dict[str, object]:
    """The flags among ``args`` that are settings of the run's configuration: every flag whose
    name is a :class:`bench.core.config.RunConfig` field (the one list of them), given or not."""
    import dataclasses

    from bench.core.config import RunConfig

    fields = {f.name for f in dataclasses.fields(RunConfig)}
    return {k: v for k, v in vars(args).items() if k in fields}


def table_flags(args, toml: dict) -> dict[str, object]:
    """The flags that extend a TOML table (``--option`` over [options], the knob flags over
    [training]), merged over it, as build_config's ``flags`` take them; only those given."""
    out: dict[str, object] = {}
    if args.option:
        out["options"] = {**toml.get("options", {}), **parse_options(args.option)}
    given = knobs.from_flags(args)
    if given:
        table = toml.get("training", {})
        out["training"] = {**(table if isinstance(table, dict) else {}), **given}
    return out


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


ARGV: list[str] = []  # the command line being parsed (for the hint in Parser.error)


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors (its own print the whole usage first); the subcommands' parsers
    are of this class too (add_subparsers makes its parsers of the parent's class)."""

    def error(self, message: str) -> NoReturn:  # type: ignore[override]
        flags = message.split(":")[0].removeprefix("argument ").split("/")
        if "expected one argument" in message:
            after = [ARGV[i + 1] for i, a in enumerate(ARGV[:-1]) if a in flags]
            if any(re.fullmatch(r"-\d.*", a) for a in after):  # the value was read as a flag
                message += f" (a value that starts with '-' goes as {flags[-1]}=VALUE)"
        self.exit(2, f"{self.prog}: error: {message}; see {self.prog} -h\n")


def chosen(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The innermost subcommand parser that ``args`` went through (``parbench history show``)."""
    while True:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        name = getattr(args, subs[0].dest, None) if subs else None
        if not subs or name not in subs[0].choices:
            return parser
        parser = subs[0].choices[name]
