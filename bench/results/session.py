"""One run's life in its folder, whatever the mode (training, serving, the collective sweep).

A :class:`RunSession` holds the run folder and its writer, writes ``meta.json`` as ``running``
when the run begins and with its final status when it ends, runs the samplers in between, and, when
asked, defers stop signals for the whole run (:func:`bench.runtime.signals.deferred`). The mode
produces rows into the writer inside the session's ``with`` block; how the block ends is the run's
status (:func:`status_of`).

The final ``meta.json`` is written whatever stopped the run; a failure to write it (a full disk)
is raised only after a run that completed, since an error that stopped the run comes first, and
alone. Hooks registered with :meth:`RunSession.at_end` run with the final status however the
session ends (a run on several nodes tells the other nodes); those registered with
:meth:`RunSession.after_complete` run only after a complete run, once its final ``meta.json`` is
written (merging a table's parts).
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.core.errors import UserError
from bench.measure.telemetry import start_samplers
from bench.results.store import RunWriter, write_meta
from bench.runtime import signals

log = logging.getLogger("parbench")

#: meta.json's status while the run goes on
RUNNING = "running"
#: every planned unit of work ran (each with its own row, whatever its outcome)
COMPLETE = "complete"
#: something unforeseen stopped the run (an exception other than a stop signal or a UserError)
FAILED = "failed"
#: a stop signal: ``interrupted by SIGTERM`` (the signal's name follows)
INTERRUPTED = "interrupted by"
#: a UserError stopped the run: ``stopped: <its message>``
STOPPED = "stopped:"


def status_of(exc: BaseException | None) -> str:
    """The status word for how a run ended: ``exc`` None (it completed), a stop signal (Ctrl-C, or
    :class:`bench.runtime.signals.Interrupted` carrying its signal), a UserError, anything else."""
    if exc is None:
        return COMPLETE
    if isinstance(exc, KeyboardInterrupt):
        return f"{INTERRUPTED} {signal.Signals(getattr(exc, 'signum', signal.SIGINT)).name}"
    if isinstance(exc, UserError):
        return f"{STOPPED} {exc}"
    return FAILED


def interrupted(status: str) -> bool:
    """Whether ``status`` says a stop signal ended the run."""
    return status.startswith(INTERRUPTED)


@dataclass(frozen=True)
class Samplers:
    """The samplers a run starts: ``hz`` (0: none, and meta.json says so), and the GPU sampler too
    when ``gpu``."""

    hz: float
    gpu: bool


Fields = Callable[[str], dict[str, Any]]


class RunSession:
    """One run's folder from ``meta.json`` ``running`` to its final status.

    ``fields(status)`` gives the mode's meta.json fields beside the config, the status and (once
    the run ended) ``interrupted``: called with RUNNING for the first meta.json, with the final
    status for the last. ``samplers``: started by :meth:`begin`, stopped when the session ends, their
    last rows handed to :attr:`drain` (by default appended to the writer's ``samples`` table).
    ``defer``: stop signals are only noted for the whole session (the mode raises them at its own
    :func:`bench.runtime.signals.check_stop`). The writer, if any, is closed when the session ends."""

    def __init__(self, run_dir: Path, config: dict[str, Any], *, writer: RunWriter | None = None,
                 fields: Fields | None = None, samplers: Samplers | None = None, defer: bool = False):
        self.dir, self.config, self.writer = Path(run_dir), config, writer
        self.fields: Fields = fields or (lambda _status: {})
        self.samplers, self.defer = samplers, defer
        self.sampler: Any = None
        self.notes: dict[str, str] = {}
        self.status = FAILED
        #: what becomes of the samplers' last rows once they stopped
        self.drain: Callable[[], None] = self._drain
        self._end: list[Callable[[str], None]] = []
        self._complete: list[Callable[[], None]] = []
        self._begun = False
        self._stack = ExitStack()

    def at_end(self, fn: Callable[[str], None]) -> None:
        """``fn(status)`` when the session ends, however it ends."""
        self._end.append(fn)

    def after_complete(self, fn: Callable[[], None]) -> None:
        """``fn()`` after a complete run, once its final meta.json is written."""
        self._complete.append(fn)

    def __enter__(self) -> RunSession:
        signals.clear_stop()  # a signal noted by an earlier run in this process is not this run's
        if self.defer:
            self._stack.enter_context(signals.deferred())
        return self

    def begin(self) -> None:
        """Start the samplers and write meta.json as ``running``: the run has begun (its final
        meta.json is written however it ends)."""
        if self.samplers is not None:
            self.sampler, self.notes = start_samplers(self.samplers.hz, gpu=self.samplers.gpu)
        write_meta(self.dir, self.config, **self.fields(RUNNING), status=RUNNING)
        self._begun = True

    def take(self) -> list[dict[str, Any]]:
        """The samplers' rows since the last call ([] without samplers)."""
        return self.sampler.drain() if self.sampler is not None else []

    def __exit__(self, _type, exc: BaseException | None, _tb) -> None:
        self.status = status_of(exc)
        if isinstance(exc, KeyboardInterrupt):
            exc.run_dir = self.dir  # type: ignore[attr-defined]  # the command's message names the folder
        try:
            try:
                self._stack.close()
                problem = self._finish()
            finally:
                for fn in self._end:
                    fn(self.status)
            if exc is None:
                if problem:  # the run itself completed, but its last samples or its meta.json were not written
                    raise UserError(problem)
                for fn in self._complete:
                    fn()
        finally:
            if self.writer is not None:
                self.writer.close()

    def _drain(self) -> None:
        if self.writer is not None:
            self.writer.append("samples", self.take())

    def _finish(self) -> str | None:
        """Stop the samplers, keep their last rows and write the final meta.json. Never raises: what
        could not be written (a full disk) is returned."""
        problem = None
        if self.sampler is not None:
            try:
                self.sampler.stop()
                self.notes.update(self.sampler.notes())
                if self._begun:
                    self.drain()
            except (OSError, UserError) as e:
                problem = str(e)
                log.debug("the last samples not written: %s", e)
        if not self._begun:
            return None
        try:
            write_meta(self.dir, self.config, **self.fields(self.status), status=self.status,
                       interrupted=interrupted(self.status))
        except (OSError, UserError) as e:
            problem = problem or str(e)
            log.info("meta.json not updated: %s", e)
        return problem
