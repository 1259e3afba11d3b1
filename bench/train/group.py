"""One process group of a training run: its launches, until every cell of the group has a row.

:class:`GroupRun` starts torchrun (:class:`bench.runtime.process.Launch`) for the cells left, follows
the ranks' events (a cell starts, fails on a rank, is measured, has its profile pass), and stops the
launch when its start-up outlives ``startup_timeout_s`` (torchrun, the ranks' imports, the
rendezvous, the warm-up: up to the first cell's start), when a cell outlives ``cell_timeout_s``
(counted from that cell's start), when the ranks are desynchronised after an error, or when a node
of the run stops answering; the cells the launch did not finish run in the next one. A row's reason
says which of the two limits ran out.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import strategies
from bench.core import spec
from bench.core.spec import CellSpec, GroupPlan
from bench.plan.matrix import Group
from bench.results.rows import build_row, failure_row, telemetry_means
from bench.results.store import write_error
from bench.runtime import signals
from bench.runtime.crash import earliest
from bench.runtime.process import Launch, child_env
from bench.train.attempt import Attempt
from bench.train.context import GroupContext, Progress, ProgressFn
from bench.train.nodes import nodes_for
from bench.train.pending import Pending, unprofiled
from bench.train.run_folder import startup_record

__all__ = ["ERROR_GRACE_S", "WORKER", "GroupRun", "Progress", "ProgressFn", "run_group"]

log = logging.getLogger("parbench")
WORKER = "bench.train.worker"  # the module every rank runs
#: A rank that fails a cell reports it and moves on to the harness's all-gather of the cell's
#: results; a peer still inside the cell may wait in a collective the failed rank will never join,
#: so the group is desynchronised and would sit until cell_timeout_s (300 s by default). When the
#: group has not finished the cell this long after a rank's error (at most half the cell timeout),
#: it is stopped, the cell fails with the earliest error, and the group is relaunched for the
#: cells it has left. A failure every rank hits at about the same time (a bad workload, an option
#: the model cannot take) finishes within the grace and costs no relaunch; ranks that fail more
#: than the grace apart cost one relaunch, never a wrong row.
ERROR_GRACE_S = 5.0


class GroupRun:
    """Run a group's cells (all their repeats, in rounds), relaunching after a timeout or a crash,
    until every cell has a row. Processes of a launch still alive when it ended are killed and
    named in ``ctx.survivors`` (and in the reason of the cell that was running). A group on several
    nodes is launched on every node (:class:`bench.train.nodes.ManyNodes`); the other nodes' rank
    errors and crash reasons count as this node's, and a node that stops answering fails the cell
    that was running and every later cell of the group. Each launch's start-up and teardown, split
    into phases (:func:`bench.train.run_folder.startup_record`), is appended to ``ctx.starts``.

    The group's state lives across launches (the cells still pending, the attempt, whether a launch
    had to be killed); each launch has its own (:class:`bench.train.attempt.Attempt`, ``self.a``),
    and each kind of event and each way a launch ends has a method of its own. ``again``: cells
    measured before, to be measured up to their spec's repeats (their rows are superseded)."""

    def __init__(self, g: Group, gid: int | str, ctx: GroupContext, again: dict[int, Pending] | None = None):
        self.g, self.gid, self.ctx, self.cfg = g, gid, ctx, ctx.cfg
        self.nodes = nodes_for(g.nnodes, ctx.cfg, ctx.coord)
        self.pending = {c.cell_id: (again or {}).get(c.cell_id) or Pending(spec=c) for c in g.cells}
        self.attempt = 0
        self.clean = True  # no launch of the group was killed (a timeout, a desynchronised error, a lost node)
        self.a: Attempt | None = None  # the launch running, or the last one
        self.grace_s = min(ERROR_GRACE_S, self.cfg.measurement.cell_timeout_s / 2)

    def run(self) -> bool:
        """Launch until every cell has a row. False when a launch of the group had to be killed
        (the budget's pacer leaves it out of its pace)."""
        while self.pending:
            self.attempt += 1
            self.a = None
            gone = self.nodes.lost()
            if gone:
                self._on_node_gone(gone)
                return False
            self.a = self._launch()
            self._follow()
            self._settle()
        return self.clean

    # --- rows and notes

    def finish(self, p: Pending, status: str | None = None, reason: str = "", profile_note: str = "") -> None:
        """The cell's row: built from its repeats (``status`` None) or a failure row."""
        c = p.spec
        if status is None:
            cls = type(strategies.get(c.strategy_spec))
            row, steps, comm = build_row(c, p.repeats, wall_s=p.wall_s, strategy_metrics=cls.metrics,
                                         expects=cls.distributes, telemetry=p.telemetry)
            if profile_note and row.get("status") == "ok":
                row["profile_note"] = profile_note
            if p.written:  # measured again: only the new repeats' steps; the comm records are the first repeat's
                steps, comm = [s for s in steps if s.get("repeat", 0) >= p.written], []
        else:
            row, steps, comm = failure_row(c, status=status, reason=reason), [], []
        del self.pending[c.cell_id]
        if p.written and len(p.repeats) <= p.written and status is None:
            # measured again but no new repeat came (the deadline): its row stands as written
            self._done(c, str(p.row["status"]))
            return
        if p.written and row.get("status") != "ok":
            # a cell measured again that failed this time keeps the row it has (its earlier repeats
            # stand); the failure is noted
            self.note(f"{self.g.label}: cell {c.cell_id} ({c.strategy}) measured again failed, its earlier "
                      f"row stands: {row.get('reason') or row.get('status')}")
            self._done(c, str(p.row["status"]))
            return
        self.ctx.writer.add(row, steps, comm)
        p.row, p.written = row, len(p.repeats)
        if row.get("status") == "ok":
            self.ctx.kept[c.cell_id] = p
        log.info("%s: cell %d (%s %s) %s", self.g.label, c.cell_id, c.strategy, c.workload.name, row["status"])
        self._done(c, row["status"])

    def _done(self, c: CellSpec, status: str) -> None:
        self.ctx.report(Progress(kind="done", group=self.g.label, cell=c, status=status))

    def note(self, text: str) -> None:
        """A note on this launch: in ``survivors``, the log, and the reason of the cell it fails."""
        self.ctx.survivors.append(text)
        if self.a is not None:
            self.a.notes.append(text)
        log.warning(text)

    def _on_node_gone(self, gone: dict[int, str]) -> None:
        why = "; ".join(f"node {r}: {w}" for r, w in sorted(gone.items()))
        for p in list(self.pending.values()):
            self.finish(p, "failed",
                        f"a node of the run is gone ({why}); nothing ran on {self.g.nnodes} nodes after that")

    # --- one launch

    def _plan(self, prefix: str) -> GroupPlan:
        """The plan of the cells left, for the launch whose files start with ``prefix``."""
        g, cfg, trace_dir = self.g, self.cfg, self.ctx.trace_dir
        # The process group's timeout also bounds its rendezvous, inside the start-up: a rank that
        # imports slowly on a loaded machine must not fail the others' rendezvous.
        return GroupPlan(backend=g.backend, device=cfg.matrix.device, n_procs=g.n_procs, events_prefix=prefix,
                         pg_timeout_s=max(cfg.measurement.cell_timeout_s, cfg.measurement.startup_timeout_s),
                         trace_dir=str(trace_dir) if trace_dir else None,
                         cells=tuple(p.spec if p.awaits_pass or not p.written else unprofiled(p.spec)
                                     for p in self.pending.values()),
                         earlier={str(k): p.steps() for k, p in self.pending.items() if p.repeats},
                         settled={str(k): s for k, p in self.pending.items() if (s := p.settled()) is not None},
                         held={str(k): s for k, p in self.pending.items()
                               if p.written and p.awaits_pass and (s := p.span()) is not None},
                         deadline_unix=self.ctx.deadline)

    def _launch(self) -> Attempt:
        """Write the plan of the cells left and start torchrun for it (on every node of the group)."""
        g, cfg, writer = self.g, self.cfg, self.ctx.writer
        prefix = str(self.ctx.work / f"g{self.gid}-a{self.attempt}")
        gplan = self._plan(prefix)
        try:
            Path(prefix + ".json").write_text(spec.dump(gplan))
        except OSError as e:
            raise write_error(Path(prefix + ".json"), e, writer.dir) from None
        nproc = g.n_procs // g.nnodes
        rendezvous = self.nodes.start(gplan, f"{writer.run_id}-g{self.gid}-a{self.attempt}", nproc)
        launched = time.time()
        try:
            # On a CPU every rank gets the threads a rank of the run's widest launch gets: a one-rank
            # cell with every core would measure another machine than its two-rank neighbour.
            widest = max(cfg.matrix.world_sizes) // g.nnodes if cfg.matrix.device == "cpu" else 0
            launch = Launch(prefix, nproc, module=WORKER, env=child_env(nproc, share=self.nodes.share, widest=widest),
                            **rendezvous)
        except OSError as e:
            if e.filename != prefix + ".log":  # not its log file: torchrun itself did not start
                raise
            raise write_error(Path(prefix + ".log"), e, writer.dir) from None
        log.info("%s attempt %d: torchrun started (pid %d)", g.label, self.attempt, launch.proc.pid)
        # on several nodes the rendezvous may also wait for the other nodes' agents to start
        return Attempt(number=self.attempt, prefix=prefix, launch=launch, launched=launched,
                       startup_s=cfg.measurement.startup_timeout_s + self.nodes.rdzv_wait_s)

    def _follow(self) -> None:
        """Handle the launch's events until it exits or has to be stopped. A stop signal is raised
        only between handled events; the cells measured before it keep their rows."""
        a = self.a
        try:
            with signals.deferred():
                try:
                    while not self._step():
                        time.sleep(0.05)
                except BaseException as stop:
                    if isinstance(stop, KeyboardInterrupt):
                        self._on_interrupt()
                    a.launch.kill(grace_s=1.0)
                    raise
        finally:
            a.remote = self.nodes.finish()  # outside the deferral: a stop while the other nodes answer raises at once

    def _step(self) -> bool:
        """One poll of the launch; True when following it ends (it exited or was stopped)."""
        a = self.a
        signals.check_stop()
        exited = a.launch.exited()
        a.queue.extend(a.launch.events.poll())
        remote = self.nodes.poll(exited)
        if remote is not None:
            a.queue.extend(remote[0])
            a.lost = remote[1]
        while a.queue:
            self.handle(a.queue[0])
            a.queue.pop(0)
        if exited:
            a.marks["exited"] = time.time()
            return True
        if a.lost:
            self._on_node_lost()
        elif a.desync_at is not None and time.monotonic() > a.desync_at:
            self._on_desync()
        elif time.monotonic() > a.deadline:
            self._on_timeout()
        else:
            return False
        return True

    # --- events of the ranks

    def handle(self, ev: spec.Event) -> None:
        """One event of a rank: a cell starts, fails on a rank, or is measured (its row)."""
        a = self.a
        if isinstance(ev, spec.Stopped):
            a.stopped = True
            return
        p = self.pending.get(ev.cell_id)
        if p is None:
            return
        if isinstance(ev, spec.Start) and ev.repeat == spec.PROFILE_PASS:
            a.current, a.in_pass = p.spec, True
            self._rearm()
            log.info("%s: profile pass of cell %d (%s) started", self.g.label, p.spec.cell_id, p.spec.strategy)
        elif isinstance(ev, spec.Start) and ev.repeat == spec.ROUNDING_PASS:
            self._rearm()
            log.info("%s: rounding probe of cell %d (%s) started", self.g.label, p.spec.cell_id, p.spec.strategy)
        elif isinstance(ev, spec.Profiled):
            self._on_profiled(p, ev)
        elif isinstance(ev, spec.Start):
            self._on_start(p)
        elif isinstance(ev, spec.Error):
            self._on_cell_error(p, ev)
        elif isinstance(ev, spec.Measured):
            self._on_measured(p, ev)

    def _rearm(self) -> None:
        """The cell timeout counts from now."""
        self.a.rearm(self.cfg.measurement.cell_timeout_s)

    def _on_start(self, p: Pending) -> None:
        a = self.a
        a.marks["first_cell"] = a.marks["first_cell"] or time.time()
        a.current, a.started_any = p.spec, True
        self._rearm()
        log.info("%s: cell %d (%s %s) started", self.g.label, p.spec.cell_id, p.spec.strategy, p.spec.workload.name)
        self.ctx.report(Progress(kind="start", group=self.g.label, cell=p.spec))

    def _on_cell_error(self, p: Pending, ev: spec.Error) -> None:
        # The earliest error is the cause; a peer's later one is usually its consequence. (Across
        # nodes the stamps are each host's wall clock: skew can reorder errors that came within it
        # of each other.)
        a = self.a
        a.errors[p.spec.cell_id] = earliest(a.errors.get(p.spec.cell_id), (ev.t, f"rank {ev.rank}: {ev.reason}"))
        if self.g.n_procs > 1 and a.desync_at is None:
            a.desync_at = time.monotonic() + self.grace_s

    def _on_measured(self, p: Pending, ev: spec.Measured) -> None:
        """A repeat of the cell is in; the cell's row when it was the last (or a rank failed)."""
        a, telemetry = self.a, self.ctx.telemetry
        samples = telemetry.take()
        window = ev.ranks[0].window if ev.ranks and ev.ranks[0].window else None
        p.telemetry.append(telemetry_means(samples, p.spec, window) if window else {})
        telemetry.flush()
        p.repeats.append(ev.ranks)
        a.marks["last_cell"] = time.time()
        p.wall_s += ev.wall_s
        p.repeat_wall_s.append(ev.wall_s)
        a.current, a.desync_at = None, None
        self._rearm()
        failed = any(r.status != "ok" for r in ev.ranks)
        if failed or (p.timed() and not p.awaits_pass):
            self.finish(p)

    def _on_profiled(self, p: Pending, ev: spec.Profiled) -> None:
        """The cell's profile pass is in: its row, with a note if the pass failed."""
        a = self.a
        self.ctx.telemetry.take()
        self.ctx.telemetry.flush()
        a.marks["last_cell"] = time.time()  # teardown starts after the last pass
        a.current, a.desync_at = None, None
        self._rearm()
        a.errors.pop(p.spec.cell_id, None)  # a failed pass is the row's note, not the cell's failure
        self.finish(p, profile_note=p.merge_profile(ev))

    def _on_interrupt(self) -> None:
        """A stop signal: a cell measured just before it is finished (its row must not be lost)."""
        try:
            for ev in [*self.a.queue, *self.a.launch.events.poll()]:
                if isinstance(ev, spec.Measured | spec.Profiled):
                    self.handle(ev)
            # every timed repeat in, its profile pass not: the timing is the row
            for p in [p for p in self.pending.values() if p.timed()]:
                self.finish(p, profile_note="" if p.written else "profile pass not run: the run was stopped")
        except Exception as e:  # noqa: BLE001 - stopping anyway; the kill below matters more
            log.warning("last events not recorded: %s", e)

    # --- stopping a launch

    def _on_node_lost(self) -> None:
        a = self.a
        self.note(f"{a.head(self.g.label)}: " + "; ".join(f"node {r} stopped answering ({w})"
                                                        for r, w in sorted(a.lost.items())))
        a.launch.kill()
        self.clean = False

    def _on_desync(self) -> None:
        self.note(f"{self.a.head(self.g.label)}: after a rank's error the other ranks had not finished "
                  f"the cell {self.grace_s:g}s later (desynchronised): group stopped"
                  + ("" if len(self.pending) <= 1 else " and relaunched for its remaining cells"))
        self.a.launch.kill()
        self.clean = False

    def _on_timeout(self) -> None:
        a = self.a
        a.timed_out, self.clean = True, False
        left = a.launch.kill()
        if left:  # ignored SIGTERM: worth knowing, its CPU time skewed the cell
            self.note(f"{a.head(self.g.label)}: killed with SIGKILL after ignoring SIGTERM: " + ", ".join(left))

    # --- after a launch

    def _settle(self) -> None:
        """Record the launch's start-up, kill what outlived it, and give rows to the cells it
        ended; the cells left run in the next launch."""
        a = self.a
        self.ctx.starts.append(startup_record(self.g.label, self.attempt, a.launched, a.marks, Path(a.prefix)))
        self._kill_survivors()
        if a.stopped or (a.launch.returncode == 0 and not a.timed_out):
            self._on_ended()
            return
        if not self.pending:
            return
        # Killed or crashed in the profile pass: the cell whose pass was running keeps its timing with a
        # note; the other cells' passes run in the relaunch (their timed repeats are all in, so the
        # relaunch's rounds skip them). Killed before the pass (a hang or crash in another cell's timed
        # repeat): cells already timed wait for the relaunch's pass, and are never the victim.
        done = [p for p in self.pending.values() if p.timed()]
        if a.in_pass or (done and not a.started_any):
            self._on_pass_broken(done)
            if a.in_pass or not self.pending:
                return
        self._on_crash()

    def _kill_survivors(self) -> None:
        """No process of this launch may outlive it (a rank that lost its agent would run on beside
        the next launch and skew its times): a survivor is killed and named."""
        a = self.a
        head = a.head(self.g.label)
        left = a.launch.survivors()
        if left:
            self.note(f"{head}: still running after torchrun exited, killed: " + ", ".join(left))
        for r, info in sorted(a.remote.items()):
            if info.get("survivors"):
                self.note(f"{head}: node {r}: still running after torchrun exited, killed: "
                          + ", ".join(info["survivors"]))

    def _on_ended(self) -> None:
        """The worker ended its rounds (the time budget) or finished: cells keep the repeats they got."""
        for p in list(self.pending.values()):
            if p.repeats:
                self.finish(p, profile_note="profile pass not run: "
                            + ("the time budget's deadline passed" if self.a.stopped else "the group ended without it")
                            if p.awaits_pass and not p.written else "")
            else:
                self.finish(p, "skipped", "time budget: the run's deadline passed before this cell's turn")

    def _on_pass_broken(self, done: list[Pending]) -> None:
        """The launch was killed or crashed in (or before) the profile pass: the timed cells it hit
        keep their timing, with a note saying why the pass is missing."""
        a = self.a
        why = self._timeout_reason(then="") if a.timed_out else a.launch.crash_reason(self.g.n_procs)
        if a.notes:
            why += "; " + "; ".join(a.notes)
        hit = [p for p in done if a.current is not None and p.spec.cell_id == a.current.cell_id] or done
        for p in hit:
            err = a.errors.get(p.spec.cell_id)
            self.finish(p, profile_note=f"profile pass {'did not finish' if a.in_pass else 'did not run'}: "
                                        f"{err[1] if err else why}")

    def _victims(self) -> list[CellSpec]:
        """Who gets the blame: the cell that was running; if none had started, every remaining cell
        (the group itself could not start), so that the group never relaunches forever."""
        a = self.a
        victims = ([a.current] if a.current is not None
                   else ([] if a.started_any else [p.spec for p in self.pending.values()]))
        return victims or [next(iter(self.pending.values())).spec]

    def _on_crash(self) -> None:
        """The launch was killed or crashed in a timed repeat: the cell(s) to blame fail with the
        rank's error, the timeout, or the crash's reason; the rest run in the relaunch."""
        a = self.a
        for v in self._victims():
            if v.cell_id in a.errors:
                status, reason = "failed", a.errors[v.cell_id][1]
            elif a.timed_out:
                status, reason = "timeout", self._timeout_reason()
            else:
                status, reason = "failed", self._crash_reason()
            gone = self.nodes.lost()
            if gone and not a.lost:  # seen after the launch ended (its ranks saw only a closed connection)
                reason += "; " + "; ".join(f"node {r} stopped answering ({w})" for r, w in sorted(gone.items()))
            if a.notes:
                reason += "; " + "; ".join(a.notes)
            self.ctx.telemetry.take()
            self.ctx.telemetry.flush()
            self.finish(self.pending[v.cell_id], status, reason)

    def _timeout_reason(self, then: str = "; group relaunched") -> str:
        """Which limit ran out: the cell's, or the start-up's (no cell of the launch had started)."""
        a = self.a
        if a.started_any or a.in_pass:
            return f"no result within cell_timeout_s={self.cfg.measurement.cell_timeout_s:g}s{then}"
        return (f"start-up timeout: the process group did not start within startup_timeout_s={a.startup_s:g}s "
                "(torchrun, the ranks' imports, rendezvous and warm-up; raise --startup-timeout on a loaded machine)")

    def _crash_reason(self) -> str:
        """The crash as this node saw it; the root cause may be on another node (its rank died;
        this node's peers only saw the connection close), so their own reasons come first."""
        reason = self.a.launch.crash_reason(self.g.n_procs)
        theirs = [f"node {r}: {i['reason']}" for r, i in sorted(self.a.remote.items()) if i.get("reason")]
        if theirs:
            reason = "; ".join(theirs) + f"; node 0: {reason}"
        return reason


def run_group(g: Group, gid: int | str, ctx: GroupContext, again: dict[int, Pending] | None = None) -> bool:
    """Run one group's cells until each has a row (:class:`GroupRun`); False when a launch of the
    group had to be killed. ``again``: cells measured before, measured up to their spec's repeats."""
    return GroupRun(g, gid, ctx, again).run()
