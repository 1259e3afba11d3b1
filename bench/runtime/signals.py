"""Stop signals (SIGINT, SIGTERM, SIGHUP) while rank processes run: noted, then raised at a safe point.

A loop that follows a launch calls :func:`check_stop` where raising loses nothing (between reading
events and handling them a raise could lose a finished cell's row); it turns :func:`defer_stops` on
while it runs, so the signal handler knows the loop will raise within its polling interval.
"""

from __future__ import annotations

import signal
from contextlib import contextmanager


class Interrupted(KeyboardInterrupt):
    """The run was stopped by a signal (SIGINT, SIGTERM, SIGHUP): cleaned up like Ctrl-C."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


#: While a group runs, a stop signal is only noted here and raised by the group's loop at a safe
#: point (between reading events and handling them a raise could lose a finished cell's row).
_STOP: list[int] = []
_IN_GROUP: list[bool] = [False]


def request_stop(signum: int) -> bool:
    """Note a stop signal; True if a group's loop will raise it within 50 ms, False if the caller
    must raise it now."""
    _STOP.append(signum)
    return _IN_GROUP[0]


def defer_stops(on: bool) -> None:
    """While on, :func:`request_stop` only notes a signal: the caller's loop raises it at its next
    :func:`check_stop`."""
    _IN_GROUP[0] = on


def check_stop() -> None:
    """Raise :class:`Interrupted` for the first stop signal noted, if any."""
    if _STOP:
        raise Interrupted(_STOP[0])


@contextmanager
def deferred():
    """Stop signals inside the block are only noted (:func:`defer_stops` on): the block's loop raises
    them at its :func:`check_stop`. Nestable: the state before the block is restored when it ends."""
    held = _IN_GROUP[0]
    defer_stops(True)
    try:
        yield
    finally:
        defer_stops(held)


@contextmanager
def stops_held():
    """A stop signal inside the block is noted and raised when it ends: for imports of compiled
    extensions (matplotlib, pyarrow), whose initialisation turns an exception raised inside it into an
    ImportError and can leave the interpreter unable to exit cleanly."""
    held = _IN_GROUP[0]
    with deferred():
        yield
    if not held:
        check_stop()


def clear_stop() -> None:
    """Forget stop signals noted earlier in this process (a new run starts)."""
    _STOP.clear()


#: Signals that stop a run like Ctrl-C: a CI cancel or `timeout` sends SIGTERM, a closed terminal SIGHUP.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def install_stop_handlers() -> None:
    """SIGTERM and SIGHUP stop the command as SIGINT does (its loop kills the process trees, keeps
    what finished and says where); a second signal during that cleanup is ignored."""

    def handler(signum, _frame):
        for s in STOP_SIGNALS:
            signal.signal(s, signal.SIG_IGN)
        if not request_stop(signum):  # inside a group the launcher raises it at a safe point
            raise Interrupted(signum)

    for s in STOP_SIGNALS:
        signal.signal(s, handler)


def restore_stop_handlers() -> None:
    for s in STOP_SIGNALS:
        signal.signal(s, signal.SIG_DFL if s != signal.SIGINT else signal.default_int_handler)
