"""Children that die with their parent, whenever it dies and however (SIGKILL included).

A run's processes form a chain: the launcher, a torchrun agent per launch, the agent's ranks. Linux
sends a child a chosen signal when the thread that started it exits (``PR_SET_PDEATHSIG``): the
kernel does it, so it holds however the parent ended. :func:`parent_death` arms it in a child the launcher
starts (the torchrun agent: ``preexec_fn``); :func:`main` arms it in a rank before the rank imports
anything heavy (torch takes seconds to import on a loaded machine, time in which an orphaned rank
would otherwise run on), and exits at once when the launcher is already gone::

    python -m bench.runtime.lifeline MODULE ARGS...   # runs MODULE as __main__ with ARGS

The death signal follows the thread that started the child: a child must be started by a thread
that outlives it (the launcher's main thread does). This module imports nothing beyond the
standard library, so that a rank arms it within milliseconds of its start.
"""

from __future__ import annotations

import ctypes
import os
import runpy
import signal
import sys
from collections.abc import Callable

#: The launching process's pid, for every rank (a rank exits when it is gone).
LAUNCHER_ENV = "PARBENCH_LAUNCHER_PID"
#: The exit code of a rank that left because its launcher or its torchrun agent is gone.
ORPHAN_EXIT = 70
PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _prctl_pdeathsig(sig: int) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def parent_death(sig: int = signal.SIGKILL) -> Callable[[], None] | None:
    """A ``preexec_fn`` for :class:`subprocess.Popen`: the child gets ``sig`` when the calling
    thread of this process exits. A parent that died between the fork and the call is caught too
    (the child then exits at once). None off Linux."""
    if not sys.platform.startswith("linux"):
        return None
    parent = os.getpid()
    libc = ctypes.CDLL(None, use_errno=True)  # resolved here: the child only calls it

    def arm() -> None:
        libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        if os.getppid() != parent:
            os._exit(ORPHAN_EXIT)

    return arm


def launcher_pid() -> int | None:
    """The launcher's pid from the environment (None when not started by one)."""
    text = os.environ.get(LAUNCHER_ENV, "")
    return int(text) if text.isdigit() else None


def alive(pid: int) -> bool:
    """Whether a process ``pid`` exists (a zombie counts as gone only once reaped)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def orphaned() -> str | None:
    """Why a rank under torchrun has nobody left to report to: its launcher is gone, or its agent
    is (the rank was re-parented to the launcher, a subreaper, or to init). None while both live,
    or when no launcher started this process."""
    launcher = launcher_pid()
    if launcher is None:
        return None
    if not alive(launcher):
        return "the launcher is gone"
    if os.getppid() in (launcher, 1):
        return "the torchrun agent is gone"
    return None


def main(argv: list[str] | None = None) -> None:
    """Arm the death signal, leave at once if orphaned already, then run ``MODULE`` as __main__."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        sys.exit("usage: python -m bench.runtime.lifeline MODULE [ARGS...]")
    _prctl_pdeathsig(signal.SIGKILL)
    why = orphaned()
    if why:
        sys.stderr.write(f"parbench: {why}; this rank exits\n")
        os._exit(ORPHAN_EXIT)
    sys.argv = [args[0], *args[1:]]
    runpy.run_module(args[0], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
