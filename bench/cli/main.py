"""The `parbench` command: run | report | compare | history | export | comm | serve | slurm | list."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from bench import __version__
from bench.cli import comm, gate, listing, report, run, serve, slurm
from bench.cli.common import ARGV, Parser, chosen
from bench.core.errors import UserError


def torch_version() -> str:
    """The installed torch's version, from its package metadata (importing torch takes seconds)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("torch")
    except PackageNotFoundError:
        try:
            import torch
        except ImportError:
            return "not installed"
        return str(torch.__version__)


class VersionAction(argparse.Action):
    """--version: ``parbench X.Y.Z (torch A.B.C)`` on stdout, exit 0; torch looked up only when asked."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0,
                         help=help or "print parbench's and torch's versions and exit")

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"parbench {__version__} (torch {torch_version()})")
        parser.exit(0)


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="parbench", description=__doc__)
    parser.add_argument("--version", action=VersionAction)
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    for command in (run, report, listing, comm, gate, serve, slurm):  # gate: compare, history, export
        command.register(sub)
    ARGV[:] = list(sys.argv[1:] if argv is None else argv)
    args, rest = parser.parse_known_args(argv)
    if rest:  # named by the (sub)command that was given, with its help (argparse names the top level)
        chosen(parser, args).error(f"unrecognized arguments: {' '.join(rest)}")
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(message)s")
    try:
        return args.func(args)
    except UserError as e:
        print(f"parbench: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader went away (parbench list | head): nothing more to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def entry() -> None:
    """The ``parbench`` command (and ``python -m bench``)."""
    import traceback

    from bench.runtime.ending import exit_with

    try:
        code = main()
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if e.code is not None and not isinstance(e.code, int):
            print(e.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - printed as Python would, then the same ending
        traceback.print_exc()
        code = 1
    exit_with(code)


if __name__ == "__main__":
    entry()
