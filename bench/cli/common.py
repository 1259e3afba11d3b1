"""What several commands share: the run flags, option parsing, the parser class, stop signals."""

from __future__ import annotations

import argparse
import math
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


def add_run_args(p, *, grouped: bool = True) -> None:
    """The flags of `run`'s settings (bench.core.settings), one group per section with ``grouped``
    (`slurm` passes its own group and takes them too), and the file they may come from."""
    from bench.core import settings

    p.add_argument("--config", help="TOML file with any of the settings below, flat (steps = 20) or by section "
                                    "([measurement] steps = 20); flags win")
    p.add_argument("--report", action="store_true", help="also write the HTML report into the run folder")
    settings.add_flags(p, sections=tuple(s for s in settings.SECTIONS if s != "nodes"), grouped=grouped)


def add_node_flags(p) -> None:
    """The multi-node flags of `run` (docs/guides/multinode.md)."""
    from bench.core import settings

    settings.add_flags(p, sections=("nodes",))


def run_settings(args) -> dict[str, object]:
    """The flags among ``args`` that set a run setting directly (bench.core.settings: the flag's
    destination is the setting's key), given or not."""
    from bench.core.settings import flag_keys

    keys = flag_keys()
    return {k: v for k, v in vars(args).items() if k in keys}


def table_flags(args, toml: dict) -> dict[str, object]:
    """The flags that extend a TOML table (``--option`` over [options], the knob flags over
    [training]), merged over it, as build_config's ``flags`` take them; only those given."""
    from bench.core.settings import flatten_toml

    flat = flatten_toml(toml)
    out: dict[str, object] = {}
    if args.option:
        table = flat.get("options", {})
        out["options"] = {**(table if isinstance(table, dict) else {}), **parse_options(args.option)}
    given = knobs.from_flags(args)
    if given:
        table = flat.get("training", {})
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
                number = float(val)
            except ValueError:
                out[key.strip()] = val
                continue
            if not math.isfinite(number):
                raise UserError(f"option {item!r}: {val} is not a finite number; e.g. --option bucket_mb=25") from None
            out[key.strip()] = number
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
