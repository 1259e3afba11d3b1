"""`parbench compare | history | export`: the argparse wiring and the printed tables.

bench/cli/main.py calls :func:`register` with its subparsers object; each subcommand sets ``func`` to
its handler, which returns the exit code (0 pass, 1 a failing cell) or raises ``UserError``
(the CLI prints it and exits 2).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table
from rich.text import Text

from bench.cli.common import install_stop_handlers, restore_stop_handlers, table_console
from bench.core.errors import UserError
from bench.runtime.signals import check_stop, clear_stop

if TYPE_CHECKING:
    import pandas as pd


def register(sub: argparse._SubParsersAction) -> None:
    """Add the compare, history and export subcommands to the ``parbench`` subparsers."""
    p = sub.add_parser("compare", help="per-cell verdicts from a rank test; exit 1 on a regression or a "
                                       "broken cell, 2 when nothing could be compared")
    p.add_argument("runs", nargs="+", metavar="RUN", help="BASE CURRENT, or CURRENT with --history")
    p.add_argument("--threshold", help="step-time slowdown that fails (default 5%%)")
    p.add_argument("--history", metavar="DIR", help="compare CURRENT with the last stable value of this history")
    p.add_argument("--machine", help="history machine to compare with (default: CURRENT's fingerprint)")
    p.add_argument("--test", default="mannwhitneyu", choices=["mannwhitneyu", "brunnermunzel"])
    p.add_argument("--single-run", dest="require_repeats", action="store_false",
                   help="let a cell measured once a side fail on its steps alone (by default it is at most "
                        "'noisy': the steps of one run do not show run-to-run drift, which made 24-38%% of real "
                        "A/A pairs on CPU look like regressions)")
    p.add_argument("--require-repeats", dest="require_repeats", action="store_true", default=True,
                   help=argparse.SUPPRESS)  # the default; kept so older workflows still parse
    p.add_argument("--fail-from-runs", type=int, default=0, metavar="N",
                   help="with --history: while the history's stable segment holds fewer than N runs (its runs' "
                        "samples are then pooled, which cannot see the drift between runs), a regression is "
                        "reported as noisy instead of failing (CI: 4, where the run-to-run test starts)")
    p.add_argument("--markdown", metavar="FILE",
                   help="markdown summary (PR comment / $GITHUB_STEP_SUMMARY); - = stdout")
    p.add_argument("--junit", metavar="FILE", help="JUnit XML, one test case per cell")
    p.add_argument("--json", metavar="FILE", help="github-action-benchmark customSmallerIsBetter JSON")
    p.set_defaults(func=cmd_compare)

    h = sub.add_parser("history", help="append-only run history: add a run, show trends and change points")
    hs = h.add_subparsers(dest="history_cmd", required=True, metavar="COMMAND")
    a = hs.add_parser("add", help="append a run, keyed by its git commit and machine")
    a.add_argument("run_dir")
    a.add_argument("--store", default=None, help="history folder (default: results/history)")
    a.add_argument("--commit", help="commit to file it under (default: meta.json git_commit)")
    a.add_argument("--machine", help="machine name (default: fingerprint of host, GPUs, torch, NCCL, CPU)")
    a.set_defaults(func=cmd_history_add)
    s = hs.add_parser("show", help="per cell: commits, stable value, change points; --plots for trend PNGs")
    s.add_argument("--store", default=None, help="history folder (default: results/history)")
    s.add_argument("--machine", help="which machine, when the store holds several")
    s.add_argument("--threshold", default="5%", help="a change point past this is a regression")
    s.add_argument("--plots", metavar="DIR", help="write one trend PNG per cell here")
    s.set_defaults(func=cmd_history_show)

    e = sub.add_parser("export", help="write a run in another tool's format")
    e.add_argument("run_dir")
    e.add_argument("--format", required=True, choices=["pytest-benchmark"])
    e.add_argument("-o", "--output", required=True, help="output file, e.g. .benchmarks/.../0001_run.json")
    e.set_defaults(func=cmd_export)


def _store(args: argparse.Namespace) -> str:
    from bench.gate.history import DEFAULT_STORE

    return args.store or DEFAULT_STORE


def stoppable(work: Callable[[], int], stopped: Callable[[], str]) -> int:
    """``work()`` with SIGINT, SIGTERM and SIGHUP stopping it as Ctrl-C does: one line on stderr
    (``stopped()`` says what was kept) and exit 128 + the signal. A stop noted while the command
    deferred it (:func:`bench.runtime.signals.defer_stops`) is raised when the work returns."""
    install_stop_handlers()
    clear_stop()
    try:
        code = work()
        check_stop()
        return code
    except KeyboardInterrupt as e:
        signum = getattr(e, "signum", signal.SIGINT)
        print(f"parbench: interrupted by {signal.Signals(signum).name}: {stopped()}", file=sys.stderr)
        return 128 + signum
    finally:
        restore_stop_handlers()


def cmd_compare(args: argparse.Namespace) -> int:
    """compare BASE CURRENT, or compare --history DIR CURRENT."""
    return stoppable(lambda: _compare(args), lambda: "no comparison was finished; each output file is whole, "
                                                    "written or as it was")


def _compare(args: argparse.Namespace) -> int:
    from bench.gate.ciout import check_output_files, write_outputs
    from bench.gate.compare import FAILING, failed, parse_threshold
    from bench.gate.verdict import DEFAULT_THRESHOLD, Gate, judge
    from bench.results.lock import check_outputs

    check_output_files(markdown=args.markdown, junit=args.junit, json=args.json)
    check_outputs(markdown=args.markdown, junit=args.junit, json=args.json)
    gate = Gate(threshold=parse_threshold(args.threshold or DEFAULT_THRESHOLD), test=args.test,
                require_repeats=args.require_repeats, fail_from_runs=args.fail_from_runs)
    want = 1 if args.history else 2
    if len(args.runs) != want:
        usage = "parbench compare --history DIR CURRENT" if args.history else "parbench compare BASE CURRENT"
        raise UserError(f"got {len(args.runs)} run folder(s), expected {want}; usage: {usage}")
    judged = judge(args.runs[-1], baseline=None if args.history else args.runs[0], history=args.history,
                   machine=args.machine, gate=gate)
    table = judged.table
    print_compare(table, gate.threshold)
    write_outputs(table, gate.threshold, markdown_file=args.markdown, junit_file=args.junit, json_file=args.json)
    if not failed(table):
        return 0
    counts = table["verdict"][table["verdict"].isin(FAILING)].value_counts()
    print(f"parbench: compare: {', '.join(f'{n} {v}' for v, n in counts.items())} (the cells above); exit 1",
          file=sys.stderr)
    return 1


def cmd_history_add(args: argparse.Namespace) -> int:
    from bench.gate.history import add

    added: list[dict] = []

    def work() -> int:
        added.append(add(args.run_dir, _store(args), commit=args.commit, machine=args.machine))
        e = added[0]
        Console().print(Text(f"added run {e['run_id']} at commit {e['commit']} for machine {e['machine']} "
                             f"to {_store(args)}"))
        return 0

    return stoppable(work, lambda: f"run {added[0]['run_id']} was added to {_store(args)} before it stopped"
                     if added else f"the run was not added; {_store(args)} is as it was")


def cmd_history_show(args: argparse.Namespace) -> int:
    return stoppable(lambda: _history_show(args), lambda: "the history was not shown; its store is unchanged")


def _history_show(args: argparse.Namespace) -> int:
    from bench.gate.compare import parse_threshold
    from bench.gate.history import show

    table = show(_store(args), args.machine, parse_threshold(args.threshold), args.plots)
    t = Table(title=Text(f"parbench history {_store(args)}"))
    for col in ("cell", "commits", "last ms", "stable ms", "stable since", "change points"):
        t.add_column(col)
    for _, r in table.iterrows():
        t.add_row(Text(r["cell"]), str(r["commits"]), f"{r['last_s'] * 1e3:.2f}", f"{r['stable_s'] * 1e3:.2f}",
                  Text(str(r["stable_since"])[:10]), Text(r["changes"] or "none"))
    console = table_console()
    console.print(t)
    if args.plots:
        console.print(Text(f"trend figures: {args.plots}"))
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    return stoppable(lambda: _export(args), lambda: f"nothing exported; -o {args.output} is as it was")


def _export(args: argparse.Namespace) -> int:
    from bench.gate.ciout import pytest_benchmark_json, write_whole
    from bench.results.lock import check_outputs

    check_outputs(o=args.output)
    doc = pytest_benchmark_json(args.run_dir)
    if not doc["benchmarks"]:
        raise UserError(f"{args.run_dir} has no ok cell with step times; nothing to export")
    out = Path(args.output)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        write_whole(out, json.dumps(doc, indent=2, default=str))
    except OSError as e:
        raise UserError(f"-o {args.output!r} cannot be written ({e.strerror or e}); pass a file path in a writable "
                        "folder") from None
    Console().print(Text(f"{len(doc['benchmarks'])} benchmark(s) -> {out}; read with: pytest-benchmark compare {out}"))
    return 0


def _fmt(v, spec: str) -> str:
    import pandas as pd

    return "–" if v is None or pd.isna(v) else format(v, spec)


STYLE = {"regression": "bold red", "broken": "bold red", "noisy": "yellow", "incomparable": "yellow",
         "improvement": "green", "fixed": "green"}


def print_compare(table: pd.DataFrame, threshold: float, console: Console | None = None) -> None:
    """The comparison as a table; every value from a run is printed as plain text, never markup.
    The texts are :mod:`bench.gate.ciout`'s, as in the report and CI's files."""
    from bench.gate.ciout import SHIFT_LEGEND, basis_text, medians_text, shift_text

    console = console or table_console()
    t = Table(title=f"parbench compare (threshold {threshold:.1%} on step time)")
    for col in ("workload", "strategy", "backend", "ws", "median ms base → current", "shift [interval]", "shift of",
                "noise floor", "verdict", "note"):
        t.add_column(col)
    for _, r in table.iterrows():
        t.add_row(*(Text(str(r[k])) for k in ("workload", "strategy", "backend", "world_size")),
                  Text(medians_text(r)), Text(shift_text(r)), Text(basis_text(r)), _fmt(r.get("noise_floor"), ".1%"),
                  Text(str(r["verdict"]), style=STYLE.get(r["verdict"], "")), Text(str(r.get("note") or "")))
    console.print(t)
    counts = table["verdict"].value_counts()
    console.print(Text(", ".join(f"{k}: {v}" for k, v in counts.items())))
    console.print(Text(SHIFT_LEGEND), style="dim")
