"""Run the matrix: plan it, start torchrun once per process group, and turn the ranks' events into rows.

Inside a group one process group runs the cells one after another (``bench.train.worker``). The launcher
follows the workers' event files (:class:`bench.train.group.GroupRun`): measurements become a row at
once (:func:`bench.results.rows.build_row`, with the telemetry of the cell's window); a cell that
raises is ``failed`` with its message; a cell that outlives ``cell_timeout_s`` is ``timeout``, the
group is stopped and relaunched with the cells it had not run; a group whose start-up (torchrun,
imports, rendezvous) outlives ``startup_timeout_s`` gives its cells a ``timeout`` that says so.
Progress goes to a callback, so the caller decides how to show it. A write into the run folder that
fails (a full disk) stops the run with one line; the rows already written stay readable.

Processes start and stop through :mod:`bench.runtime`: the launcher is the child subreaper of its
descendants and follows each launch's whole process tree, so a timeout, a signal or an exception
kills all of it, and a process still alive after its launch ended is killed and named in the row and
in ``meta.json`` (``survivors``). If the launcher dies, even by SIGKILL, the kernel kills its torchrun
agents and their ranks (:mod:`bench.runtime.lifeline`); each rank also runs a watchdog
(:func:`bench.train.watchdog.start_watchdog`) that exits it when the launcher or its agent is gone.
``run(..., resume=RUN)`` runs only the cells RUN has no row for.

On several nodes (``--nnodes``) every node's launcher plans the same matrix; node 0 runs this module
as on one node, each group of several processes as a torchrun over every node (c10d rendezvous),
while the other nodes follow its commands (:mod:`bench.multinode`).
"""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path
from typing import Any

from bench.core.errors import UserError
from bench.core.settings import RunConfig
from bench.core.values import parse_duration
from bench.decide import best
from bench.multinode import plan_digest
from bench.multinode.follow import follow
from bench.multinode.nodes import Coordinator
from bench.plan import estimate
from bench.plan.budget import Pacer, budget_plan, start_cost
from bench.plan.matrix import Planned, group, plan, runnable
from bench.results.folder import check_out
from bench.results.rows import failure_row
from bench.results.session import RUNNING, Fields, RunSession, Samplers
from bench.results.store import RunWriter, write_error
from bench.runtime import signals
from bench.runtime.process import become_subreaper
from bench.train.adaptive import RESERVE, decide
from bench.train.context import GroupContext, Progress, ProgressFn, RunPlan
from bench.train.group import WORKER, run_group
from bench.train.run_folder import Telemetry, earlier_starts, open_run
from bench.train.search import enabled as search_on
from bench.train.search import search


def run(cfg: RunConfig, gpus: int, *, on_progress: ProgressFn | None = None, resume: Path | None = None) -> Path:
    """Run the whole matrix (or, with ``resume``, the cells that run folder has no row for, appended
    to it); returns the run folder. Rows land on disk as cells finish.

    With ``cfg.nodes.nnodes > 1`` node 0 does this, hosting the rendezvous and waiting for the other
    nodes to join with the same plan first; another node follows node 0 instead
    (:func:`bench.multinode.follow.follow`) and returns its own work folder (the tables are on
    node 0)."""
    signals.clear_stop()  # a signal noted by an earlier run in this process is not this run's
    invoked = time.time()  # this invocation's start (a resumed run keeps the first one's created_utc)
    cells, wls, metrics = plan(cfg, gpus)
    budget_s = parse_duration(cfg.budget.duration) if cfg.budget.duration else None
    plan_text = ""
    if budget_s is not None:
        cells, plan_text = budget_plan(cfg, cells, budget_s, reserve=reserve(cfg))
    elif cfg.nodes.node_rank == 0:  # what it will take, before it starts (a budget says so in its plan)
        rate = estimate.device_rate(cfg.matrix.device, max(cfg.matrix.world_sizes))
        print(estimate.estimate_line(cfg, cells, estimate.estimate_s(cfg, cells, rate)), flush=True)
    coord = None
    if cfg.nodes.nnodes > 1:
        if resume is not None:
            raise UserError("--resume of a run on several nodes is not supported; run it again")
        if cfg.nodes.node_rank > 0:
            return _follow_node0(cfg, cells, on_progress)
        coord = _coordinate(cfg, cells)
    try:
        run_dir, writer, work, done = open_run(cfg, metrics, resume)
    except BaseException:
        if coord is not None:
            coord.close("failed")
        raise
    # a resumed run whose folder holds cells beyond the plan's ran its search already
    todo = RunPlan(cells=[p for p in cells if p.spec.cell_id not in done], searched=any(i >= len(cells) for i in done),
                   described={n: w.description for n, w in wls.items()}, text=plan_text, budget_s=budget_s,
                   gpus=gpus)
    _record(cfg, todo, writer, work, on_progress or (lambda _p: None), coord,
            _meta_extra(run_dir, resume, done, invoked, coord))
    return run_dir


def _record(cfg: RunConfig, todo: RunPlan, writer: RunWriter, work: Path, report: ProgressFn,
            coord: Coordinator | None, extra: dict[str, Any]) -> None:
    """Run the cells into the open run folder (:class:`bench.results.session.RunSession`):
    meta.json, the telemetry, every group, the final meta.json, then one part per table. A write
    that fails (a full disk) stops it with one line; the rows already written stay. The session
    ends however the run does: the writer is closed and, on several nodes, the other nodes told."""
    run_dir = writer.dir
    survivors: list[str] = []
    session = RunSession(run_dir, cfg.to_dict(), writer=writer,
                         samplers=Samplers(cfg.profiling.sample_hz, cfg.matrix.device == "cuda"))
    session.fields = _meta_fields(cfg, todo, session, survivors, extra)
    if coord is not None:
        session.at_end(coord.close)
    # One part per table from here on (reading a long run's thousands of parts costs seconds);
    # only after a complete run: an interrupted one keeps its parts for --resume.
    if not os.environ.get("PARBENCH_KEEP_PARTS"):
        session.after_complete(writer.compact)
    with session:
        if coord is not None:
            coord.accept(run_dir)
        become_subreaper()
        trace_dir = run_dir / "traces" if cfg.profiling.trace else None
        if trace_dir:
            try:
                trace_dir.mkdir(exist_ok=True)
            except OSError as e:
                raise write_error(trace_dir, e, run_dir) from None
        session.begin()
        telemetry = Telemetry(session.sampler, writer, remote=coord.samples if coord is not None else None)
        session.drain = telemetry.last
        ctx = GroupContext(cfg=cfg, writer=writer, work=work, telemetry=telemetry, report=report,
                           trace_dir=trace_dir, survivors=survivors, starts=extra["group_starts"], coord=coord)
        _run_groups(todo, ctx, extra)


def _meta_fields(cfg: RunConfig, todo: RunPlan, session: RunSession, survivors: list[str],
                 extra: dict[str, Any]) -> Fields:
    """meta.json's training fields: the workloads, the budget's plan and ``extra``
    (:func:`_meta_extra`); once the run ended, also the telemetry's notes and ticks and the notes on
    processes that outlived their launch."""

    def fields(status: str) -> dict[str, Any]:
        if status == RUNNING:
            return {"workloads": todo.described, "plan": todo.text, **extra}
        ticks = session.sampler.ticks if session.sampler is not None else 0
        return {"workloads": todo.described, "telemetry": session.notes, "sample_hz": cfg.profiling.sample_hz,
                "sampler_ticks": ticks, "plan": todo.text, "survivors": survivors, **extra}

    return fields


def adaptive(cfg: RunConfig) -> bool:
    """Whether the run measures open decisions again: under a budget, on one node, unless turned off
    or the repeats were given (the user chose how many)."""
    b = cfg.budget
    return bool(b.adaptive and b.duration and cfg.nodes.nnodes == 1 and "repeats" not in b.pinned)


def reserve(cfg: RunConfig) -> float:
    """The share of the budget the screening pass leaves for what follows it: the knob search's
    with the adaptive repeats it runs in its final rounds (:data:`SEARCH_SHARE`, and
    :data:`AFTER_SEARCH` more in an adaptive run), or the adaptive repeats' alone
    (:data:`bench.train.adaptive.RESERVE`)."""
    if search_on(cfg):
        return SEARCH_SHARE + (AFTER_SEARCH if adaptive(cfg) else 0.0)
    return RESERVE if adaptive(cfg) else 0.0


#: the shares of a budget the knob search may spend after the screening pass, and what an adaptive
#: run adds for its repeats (on one GPU the screening pass is one cell: the search takes its time too)
SEARCH_SHARE, AFTER_SEARCH = 0.4, 0.15


def _follow_node0(cfg: RunConfig, cells: list[Planned], on_progress: ProgressFn | None) -> Path:
    """A node other than node 0 follows node 0's launches; its work folder."""

    check_out(cfg.output.out)
    return follow(cfg, plan_digest(cells), len(cells), on_progress=on_progress, module=WORKER)


def _coordinate(cfg: RunConfig, cells: list[Planned]):
    """Node 0: host the rendezvous and wait until every node joined with the same plan."""

    check_out(cfg.output.out)
    coord = Coordinator(cfg, plan_digest(cells), len(cells))
    coord.wait_joined()
    return coord


def _meta_extra(run_dir: Path, resume: Path | None, done: set[int], invoked: float, coord) -> dict[str, Any]:
    """What meta.json holds beyond the config and the plan: the cells a resume found done, the
    launches' start-up records (filled as the groups run), this invocation's start, the nodes."""
    extra: dict[str, Any] = {"resumed": sorted(done)} if resume is not None else {}
    extra["group_starts"] = earlier_starts(run_dir) if resume is not None else []
    extra["invoked_unix"] = round(invoked, 3)
    if coord is not None:
        extra["nodes"] = [{"node": r, **{k: v for k, v in n.items() if k in ("host", "addr", "iface")}}
                          for r, n in sorted(coord.nodes.items())]
    return extra


def _run_groups(todo: RunPlan, ctx: GroupContext, meta: dict[str, Any]) -> None:
    """The skipped cells' rows, then every group in turn; under a budget, a group that cannot start
    before the deadline is skipped, and the pacer re-plans each group's time cap. Then, when the run
    is adaptive, the rounds for the decisions still open (recorded in ``meta`` as ``adaptive``)."""
    cfg, writer, report, cells, budget_s = ctx.cfg, ctx.writer, ctx.report, todo.cells, todo.budget_s
    writer.append("cells", [failure_row(p.spec, status="skipped", reason=p.reason)
                            for p in cells if p.reason is not None])
    groups = group(cells)
    report(Progress(kind="plan", group="", n=runnable(cells)))
    if todo.text:
        report(Progress(kind="note", group="", text=todo.text))
    deadline = time.time() + budget_s if budget_s else None
    ctx = dataclasses.replace(ctx, deadline=deadline)
    # the screening pass paces itself to leave the search and the adaptive rounds their shares
    screen_end = deadline - reserve(cfg) * budget_s if deadline is not None else None
    pacer = (Pacer(cfg, groups) if budget_s and cfg.nodes.nnodes == 1
             and "time_cap_s" not in cfg.budget.pinned else None)
    for gid, g in enumerate(groups):
        if pacer is not None:
            g = pacer.next_group(gid, screen_end - time.time())
        # A group that cannot even start and build its cells before the deadline is not started.
        if deadline is not None and time.time() + start_cost(cfg, g) > deadline:
            for c in g.cells:
                writer.add(failure_row(c, status="skipped", reason="time budget: the run's deadline passed "
                                                                 "before this cell's group"))
                report(Progress(kind="done", group=g.label, cell=c, status="skipped"))
            continue
        report(Progress(kind="group", group=g.label, n=len(g.cells)))
        clean = run_group(g, gid, ctx)
        if pacer is not None:
            pacer.group_done(screen_end - time.time(), clean=clean is not False)
    if deadline is not None and search_on(cfg):
        if todo.searched:
            meta["search"] = {"mode": cfg.budget.search, "skipped": "the run was resumed after its search began: "
                                                                   "its candidates' rows are kept as measured"}
        else:
            # the search's stages leave the adaptive repeats their share at several devices; its final
            # rounds repeat the open strategy decisions' cells too, in the same process groups, until
            # the deadline, and the adaptive rounds after it take what they leave
            several = any(p.reason is None and p.spec.n_devices > 1 for p in cells)
            share = AFTER_SEARCH * budget_s if adaptive(cfg) and several else 0.0
            meta["search"] = search(ctx, todo, deadline - share, decisions=adaptive(cfg), until=deadline)
    if deadline is not None and adaptive(cfg):
        meta["adaptive"] = decide(ctx, searched=best.searched(meta))
