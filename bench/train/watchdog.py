"""A rank's watchdog: a thread that exits the rank when its launcher or its torchrun agent is gone."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import psutil

from bench.runtime.lifeline import LAUNCHER_ENV, ORPHAN_EXIT
from bench.train.events import write_error

WATCHDOG_EXIT = ORPHAN_EXIT  # a rank that left because its launcher or torchrun agent is gone
WATCHDOG_POLL_S = 0.5


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def start_watchdog(err_path: Path) -> None:
    """Exit this rank when the launcher or the torchrun agent is gone (killed, even by SIGKILL,
    which nothing can catch): otherwise the rank would run the group's remaining cells, or hang in
    a collective, with nobody left to read its results or stop it. The agent is gone when this
    process is re-parented (to the launcher, a subreaper, or to init)."""
    agent = os.getppid()
    launcher = None
    if os.environ.get(LAUNCHER_ENV, "").isdigit():
        try:
            launcher = psutil.Process(int(os.environ[LAUNCHER_ENV]))
        except psutil.Error:  # killed while this rank was importing torch
            write_error(err_path, "watchdog: the launcher is gone; this rank exits")
            os._exit(WATCHDOG_EXIT)

    def watch() -> None:
        while True:
            time.sleep(WATCHDOG_POLL_S)
            gone = ("torchrun agent" if os.getppid() != agent
                    else "launcher" if launcher is not None and not _alive(launcher) else None)
            if gone:
                write_error(err_path, f"watchdog: the {gone} is gone; this rank exits")
                os._exit(WATCHDOG_EXIT)

    threading.Thread(target=watch, name="parbench-watchdog", daemon=True).start()
