"""A group of long-lived processes of the harness's own code, started by multiprocessing (spawn).

Serving keeps one placement's processes up across many cells and talks to them through queues;
:class:`Spawned` is that group without the talking: it makes the queues, starts the processes
(spawned: CUDA cannot fork), names the ones that died, and stops all of them with whatever they
started themselves. The caller asks its processes to quit (its own message on its own queue)
before :meth:`Spawned.stop`; a process that does not exit within the grace period gets SIGTERM,
then SIGKILL.
"""

from __future__ import annotations

import multiprocessing as mp
import os
from collections.abc import Callable
from typing import Any

import psutil

from bench.runtime.process import kill_all


class Spawned:
    """Processes started with the ``spawn`` context, and the queues they share with this one."""

    def __init__(self) -> None:
        quiet_resource_tracker()
        self.ctx = mp.get_context("spawn")
        self.procs: list[Any] = []
        self.queues: list[Any] = []

    def queue(self) -> Any:
        """A new queue, released by :meth:`stop`."""
        q = self.ctx.Queue()
        self.queues.append(q)
        return q

    def start(self, target: Callable[..., Any], args: tuple, name: str) -> Any:
        """Start ``target(*args)`` in a new process called ``name`` (a daemon: it dies with this one)."""
        p = self.ctx.Process(target=target, args=args, daemon=True, name=name)
        p.start()
        self.procs.append(p)
        return p

    def dead(self) -> list[str]:
        """Names of the processes that have exited."""
        return [p.name for p in self.procs if not p.is_alive()]

    def stop(self, grace_s: float = 5.0) -> list[str]:
        """Wait up to ``grace_s`` for each process to exit, SIGTERM the ones still running and
        SIGKILL what is left after another ``grace_s``; their own children go with them. Returns the
        names of the processes that had to be signalled."""
        children = _descendants(self.procs)
        stuck = []
        for p in self.procs:
            p.join(timeout=grace_s)
            if p.is_alive():  # our own child, by its handle: a stuck exit must not hold the run
                stuck.append(p.name)
                p.terminate()
                p.join(timeout=grace_s)
            if p.is_alive():
                p.kill()
                p.join(timeout=1.0)
        kill_all(children)
        # Requests still buffered for a process that is gone (a cell past its timeout leaves a
        # backlog) would hold this process at exit: a queue's feeder thread is joined at exit and
        # blocks on a pipe nobody reads.
        for q in self.queues:
            q.cancel_join_thread()
        return stuck


#: The warnings filter that keeps the resource tracker's reports off stderr.
TRACKER_QUIET = "ignore::UserWarning:multiprocessing.resource_tracker"


def quiet_resource_tracker() -> None:
    """Keep the resource tracker that the queues start from writing to stderr. A stop signal sent to
    the whole process group at start-up can end a process between creating a queue's semaphore and
    recording its release; the tracker then unlinks the semaphore itself and says so in four lines
    of warnings after the run's one-line answer. The tracker is a new interpreter that takes its
    warning filters from the environment, so the filter goes there (for the processes this one
    starts afterwards too; it touches no other warning)."""
    have = os.environ.get("PYTHONWARNINGS", "")
    if TRACKER_QUIET not in have.split(","):
        os.environ["PYTHONWARNINGS"] = f"{have},{TRACKER_QUIET}" if have else TRACKER_QUIET


def _descendants(procs: list[Any]) -> list[psutil.Process]:
    """The processes the group's processes started, captured while their parents are alive."""
    out = []
    for p in procs:
        try:
            out.extend(psutil.Process(p.pid).children(recursive=True))
        except (psutil.Error, ValueError, TypeError):  # gone, or never started (no pid)
            continue
    return out


