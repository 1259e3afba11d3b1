"""The `parbench` command: run | report | compare | history | export | comm | serve | slurm | list."""

from __future__ import annotations

import logging
import os
import sys

from bench import __version__
from bench.cli import comm, gate, listing, report, run, serve, slurm
from bench.cli.common import ARGV, Parser, chosen
from bench.core.errors import UserError


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="parbench", description=__doc__)
    parser.add_argument("--version", action="version", version=f"parbench {__version__}")
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


if __name__ == "__main__":
    sys.exit(main())
