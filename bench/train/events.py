"""What a rank tells its launcher: events, error lines and the leader's start-up marks.

Each rank appends JSON-line events (:class:`Events`) and, when it fails or its watchdog stops it, one
line to its own error file (:func:`write_error`); the leader also writes its start-up marks
(:func:`write_startup`). The launcher reads all three; this module only writes.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from bench.core import spec


class Events:
    """Append-only JSON lines, flushed per line so the launcher sees progress as it happens."""

    def __init__(self, path: Path):
        self.f = open(path, "a", buffering=1)

    def emit(self, event: spec.Event) -> None:
        self.f.write(spec.dump(event) + "\n")
        self.f.flush()


def one_line(e: BaseException) -> str:
    msg = " ".join(str(e).split())
    return f"{type(e).__name__}: {msg}"[:500]


def write_error(path: Path, line: str) -> None:
    """One error line into this rank's own error file, for the launcher's failure row."""
    try:
        with open(path, "a") as f:
            f.write(line.replace("\n", " ") + "\n")
    except OSError:
        pass


def process_start() -> float | None:
    """When this process was created (unix time, to the clock tick), from its age in /proc: psutil's
    create_time adds the boot time in whole seconds, too coarse for a start-up split. None off Linux."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22, starttime
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return time.time() - (uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


def write_startup(path: Path, marks: dict[str, float | None]) -> None:
    """The leader's start-up marks (unix times: process created, Python, torch and the harness
    imported, device set, process group up, placement gathered, warm-up done) for the
    launcher's record of where a group's start-up goes (``meta.json`` ``group_starts``)."""
    try:
        path.write_text(json.dumps(marks))
    except OSError:
        pass
