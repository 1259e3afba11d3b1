"""``parbench run`` (and ``tune``, its wider search): plan the matrix, run it, print the summary, the
recommendation, the search's answer and the budget use."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

from bench.cli.common import (
    add_node_flags,
    add_run_args,
    install_stop_handlers,
    report_interrupt,
    restore_stop_handlers,
    run_settings,
    table_flags,
)
from bench.core import backends, knobs
from bench.core.errors import UserError

if TYPE_CHECKING:
    from bench.results.run import Run


def register(sub) -> None:
    p = sub.add_parser("run", help="run a benchmark matrix and write results/<run-id>/")
    add_run_args(p)
    p.add_argument("--resume", metavar="RUN", help="finish the run folder RUN (killed or interrupted): run only the "
                                                   "cells it has no row for, with its own settings, appending to it")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--table", action="store_true", help="end with the table of every cell (default: a summary; "
                                                        "parbench report has every cell)")
    add_node_flags(p)
    p.set_defaults(func=cmd_run)
    t = sub.add_parser("tune", help="a longer run that searches wider: parbench run --search wide --budget 30m "
                                    "(either may be given)")
    add_run_args(t)
    t.add_argument("--no-progress", action="store_true", help="no progress bar")
    t.add_argument("--table", action="store_true", help="end with the table of every cell")
    t.set_defaults(func=cmd_tune, resume=None)


#: what `parbench tune` runs unless told otherwise
TUNE_SEARCH, TUNE_BUDGET = "wide", "30m"


def cmd_tune(args) -> int:
    """``parbench tune``: ``run`` with the wide search and a 30-minute budget unless given."""
    if getattr(args, "search", None) is None:
        args.search = TUNE_SEARCH
    if getattr(args, "budget", None) is None:
        args.budget = TUNE_BUDGET
    return cmd_run(args)


def check_gpus(cfg, gpus: int) -> None:
    """A GPU run on a machine without GPUs is an error, not a run of nothing that exits 0."""
    if gpus > 0:
        return
    if cfg.matrix.device == "cuda":
        raise UserError("--device cuda: no GPU visible; use --device cpu (with --backends gloo)")
    for name in cfg.matrix.backends:
        b = backends.get(name)
        if b.unsupported("cpu"):
            raise UserError(f"--backends {name}: no GPU visible ({b.title} needs CUDA); "
                            f"use --backends {backends.default_for('cpu').name}")


def resumed_config(run_dir: str, gpus: int):
    """The settings of the run folder ``run_dir`` (its meta.json), for ``--resume``: the plan, and so
    the cell ids, are the original's."""
    from bench.core.config import validate
    from bench.results.run import load_meta

    d = Path(run_dir)
    if not d.is_dir() or not (d / "meta.json").is_file():
        raise UserError(f"--resume {run_dir!r} is not a parbench run folder (no meta.json); pass results/<run-id>")
    config = load_meta(d).get("config")
    if not isinstance(config, dict) or not config:
        raise UserError(f"--resume {run_dir!r}: meta.json has no config; run it again instead")
    if "training" not in config:
        # recorded before the training knobs: its plan (SGD, and the strategies "all" named then) cannot
        # be rebuilt cell for cell, and a resumed cell would train another way than the finished ones
        raise UserError(f"--resume {run_dir!r}: the run was recorded by a parbench without the training knobs "
                        "(it trained with SGD); run it again instead, with --optimizer sgd to match it")
    # a meta.json without profile_at comes from a version that profiled inline: its resumed cells keep that order
    config = {"profile_at": "inline" if config.get("profile_steps", 2) else "auto", **config}
    try:
        return validate(config)
    except TypeError as e:
        raise UserError(f"--resume {run_dir!r}: its config is from another parbench version ({e}); "
                        "run it again instead") from None


def run_config(args, gpus: int):
    """The run's configuration from ``args`` on a machine with ``gpus`` GPUs: the resumed run's own,
    or this machine's defaults (with its model sized beyond one GPU, on two or more), then the
    config file, then the flags."""
    from bench.core.config import build_config, load_toml

    flags = run_settings(args)
    if args.resume:
        given = [k for k, v in flags.items() if v is not None] + (["option"] if args.option else []) \
            + list(knobs.from_flags(args)) + (["config"] if args.config else [])
        if given:
            raise UserError(f"--resume takes the run's own settings; drop --{given[0].replace('_', '-')}")
        return resumed_config(args.resume, gpus)
    toml = load_toml(args.config) if args.config else {}
    flags.update(table_flags(args, toml))
    from bench.plan import memory

    return build_config(toml=toml, flags=flags, gpus=gpus, beyond=memory.beyond_one_device() if gpus > 1 else None)


def cmd_run(args) -> int:
    from bench.measure.hardware import gpu_count

    gpus = gpu_count()
    cfg = run_config(args, gpus)
    check_gpus(cfg, gpus)
    from bench.cli.progress import MatrixProgress
    from bench.train import launcher as launch

    install_stop_handlers()
    from bench.multinode import NodeLost

    try:
        with MatrixProgress(enabled=not args.no_progress and cfg.nodes.node_rank == 0) as bar:
            run_dir = launch.run(cfg, gpus, on_progress=bar, resume=Path(args.resume) if args.resume else None)
        if cfg.nodes.node_rank > 0:
            print(f"node {cfg.nodes.node_rank}: done; node 0 wrote the tables (this node's logs: {run_dir})")
            return 0
        return after_run(run_dir, report=args.report, table=args.table)
    except NodeLost as e:
        print(f"parbench: node {cfg.nodes.node_rank}: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as e:
        return report_interrupt(e, "the cells that finished", "; finish it with parbench run --resume {where}")
    finally:
        restore_stop_handlers()


def after_run(run_dir: Path, *, report: bool, table: bool = False) -> int:
    """The summary (every cell with ``table``), the budget use, (``report``) the HTML report and the
    recommendation, last, of the complete run ``run_dir``. A stop signal here (the caller's stop
    handlers are still installed) or a report that cannot be written ends the command with one line;
    the run's rows are whole."""
    from bench.cli.summary import print_summary
    from bench.runtime.signals import stops_held

    try:
        with stops_held():  # compiled extensions imported whole, a stop signal raised after them
            import pyarrow.parquet  # noqa: F401
            if report:
                import reports  # noqa: F401 - matplotlib
        from bench.decide import picks
        from bench.results.run import load_run

        run = load_run(run_dir)  # the one read of the finished run: every part below takes it
        decisions = picks.decide(run)  # decided once, kept in the folder, rendered by terminal and report
        picks.store(run, decisions)
        print_summary(run, table=table)
        print_budget_use(run)
        if report:
            print(f"report: {write_report(run, decisions)}")
        print_recommendation(run, decisions=decisions)  # last: the answer is what a terminal's reader sees first
        print_search(run, decisions)
        return nothing_measured(run)
    except KeyboardInterrupt as e:
        e.run_dir = run_dir  # type: ignore[attr-defined]
        return report_interrupt(e, "the run's cells (all of them finished)",
                                "; write its report with parbench report {where}" if report else "")


def nothing_measured(run: Run | Path) -> int:
    """1, with one line on stderr saying why, when cells ran and none of them is ok (every one failed
    or timed out); 0 otherwise. A run that measured nothing is not a success a script may read on."""
    from bench.results.run import load_run

    ran = load_run(run).ran
    if ran.empty or (ran["status"] == "ok").any():
        return 0
    counts = ran["status"].value_counts()
    first = ran.iloc[0]
    print(f"parbench run: no cell was measured: {', '.join(f'{n} {s}' for s, n in counts.items())}; the first, "
          f"{first['workload']} {first['strategy']} x{first['world_size']}: {first['reason'] or first['status']}; "
          "exit 1", file=sys.stderr)
    return 1


def write_report(run: Run, decisions: list | None = None) -> Path:
    """The HTML report of ``run`` (with its ``decisions``); a report that cannot be written (a full
    disk) is one line."""
    from bench.results.store import os_reason
    from reports import build_report

    try:
        return build_report(run, decisions=decisions)
    except OSError as e:
        raise UserError(f"cannot write the report of {run.path} ({os_reason(e)}); the run's cells are kept: "
                        f"free space and run parbench report {run.path}") from None


def print_budget_use(run: Run | Path) -> None:
    """One line after a budgeted run: this invocation's time against the budget (a resumed run got
    the budget afresh), what the deadline cut, and what the process groups' start-ups cost
    (meta.json ``group_starts``). Best effort: a meta.json it cannot read gives no line."""
    import pandas as pd

    from bench.core.values import parse_duration
    from bench.results.run import load_run

    try:
        run = load_run(run)
        meta, budget = run.meta, run.meta.budget
        if not budget:
            return
        budget_s = parse_duration(budget)
        start, took = meta.started_unix, meta.took_s
        starts = [g for g in meta.group_starts if g.get("launched_unix", start) >= start]
        start_s = sum(float(g.get("start_s") or 0.0) for g in starts)
        cells = run.cells
        cut = int((cells["status"].eq("skipped") & cells["reason"].fillna("").str.startswith("time budget")).sum())
        done = len(run.ran)
        ran = cells[cells["status"] == "ok"]
        rounds_cut = 0
        if {"repeats", "repeats_done"} <= set(ran.columns):  # a folder written before repeats_done has neither
            short = pd.to_numeric(ran["repeats"], errors="coerce") - pd.to_numeric(ran["repeats_done"],
                                                                                 errors="coerce")
            rounds_cut = int(short.clip(lower=0).fillna(0).sum())
    except Exception:  # noqa: BLE001 - a summary line, never a reason for the finished run to fail
        return
    print(f"budget {budget}: the run took {took:.0f} s ({took / budget_s:.0%})"
          + (" since its resume" if meta.get("resumed") is not None else "")
          + f"; {done} cells measured, {cut} cut by the deadline"
          + (f", {rounds_cut} repeats asked for but cut by it" if rounds_cut else "")
          + f"; {len(starts)} process group start-ups took {start_s:.0f} s")
    rounds = meta.adaptive
    if rounds is not None:
        again = {c for r in rounds for c in (r.get("cells") or {})}
        print(f"adaptive repeats: {len(rounds)} round(s) measured {len(again)} cells of open decisions again, "
              f"in {sum(float(r.get('seconds') or 0) for r in rounds):.0f} s"
              if rounds else "adaptive repeats: no round (no open decision that repeats could close fitted the "
                             "time left)")


def print_search(run: Run, decisions: list, console=None) -> None:
    """The search's answer after the recommendation (it is the answer of a run of one device):
    each slot's fastest configuration, RUN/best.toml written for the first, what was pruned, and on
    one GPU the estimates at more GPUs."""
    from rich.text import Text

    from bench.cli.summary import end_console
    from bench.decide import best
    from reports import search

    found = best.answers(run)
    toml = best.write(run, found)
    console = console or end_console()
    for line in search.lines(run, found, toml):
        console.print(Text(line), soft_wrap=True)


def print_recommendation(run: Run | Path, console=None, *, decisions: list | None = None) -> None:
    """The report's first screen, as the last lines of `parbench run` (plain text, never markup):
    per workload, backend and world size the answer, whether it is decided, why, what was measured
    and what to try next; launch-bound (toy) workloads after the rest, one line each."""
    import textwrap

    from rich.text import Text

    from bench.cli.summary import end_console
    from bench.decide import picks
    from bench.results.run import load_run
    from reports import words

    run = load_run(run)
    real, toys = words.split(decisions if decisions is not None else picks.of(run))
    console = console or end_console()
    if not real and not toys and not (run.training["world_size"] > 1).any() and run.meta.get("search"):
        return  # one device measured and searched: the search's answer is the recommendation

    def say(line: str, indent: str) -> None:
        # strategy names keep their hyphens on one line ("allreduce-bucketed", not "allreduce-" and "bucketed")
        for part in textwrap.wrap(line, console.width, initial_indent=indent, subsequent_indent=indent + "    ",
                                  break_on_hyphens=False):
            console.print(Text(part), soft_wrap=True)

    for line, indent in words.screen(real, toys, words.nothing_beyond_one(run.training)):
        say(line, indent)
