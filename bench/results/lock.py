"""One writer per run folder, and outputs kept off a run's own files.

A command that writes a run folder's tables (``parbench run``, ``run --resume``) holds an exclusive
lock on ``RUN/.parbench.lock`` while it writes: a second writer of the same folder is refused in one
line that names the holder. The lock is the kernel's (``flock``): a writer that dies, even by
SIGKILL, leaves no stale lock behind. Outputs a command writes at a path the user gives (an export,
a CI summary, a report folder) are refused inside a run folder, but for its ``report/``: a run's
tables and ``meta.json`` are only ever written by the run.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import sys
import time
from pathlib import Path

from bench.core.errors import UserError

LOCK_NAME = ".parbench.lock"
#: the part of a run folder that outputs may go to: what `parbench report` writes by default
OUTPUT_FOLDERS = ("report",)


class RunLock:
    """The exclusive lock on one run folder, held until :meth:`release` (or the process ends)."""

    def __init__(self, run_dir: Path, command: str):
        import fcntl

        self.path = Path(run_dir) / LOCK_NAME
        try:
            self.file = open(self.path, "a+b")  # noqa: SIM115 - held open for the lock's life
        except OSError as e:
            raise UserError(f"cannot lock {run_dir} ({e.strerror}); pass a run folder you can write to") from None
        try:
            fcntl.flock(self.file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(self.path)
            self.file.close()
            raise UserError(f"{run_dir} is being written by {holder}; wait until it ends (then resume it if it "
                            "stopped), or pass another folder") from None
        except OSError as e:  # a file system without flock (Lustre without -o flock, some NFS and FUSE)
            if e.errno not in (errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOLCK, errno.EINVAL):
                raise
            logging.getLogger("parbench").warning(
                "%s: this file system does not lock files (%s); run one writer of the folder at a time",
                run_dir, e.strerror)
            return
        self.file.truncate(0)
        self.file.write(json.dumps({"pid": os.getpid(), "command": command,
                                    "since": time.strftime("%Y-%m-%d %H:%M:%S")}).encode())
        self.file.flush()

    def release(self) -> None:
        """Drop the lock (closing the file drops the flock); a second call does nothing."""
        self.file.close()


def _holder(path: Path) -> str:
    try:
        info = json.loads(path.read_bytes()[:4096] or b"{}")
        return f"{info.get('command', 'parbench')} (pid {int(info['pid'])}, since {info.get('since', '?')})"
    except (OSError, ValueError, KeyError, TypeError):
        return "another parbench process"


def run_folder_of(path: Path) -> Path | None:
    """The run folder ``path`` lies in (an ancestor, or itself, that holds a meta.json), or None."""
    p = Path(os.path.abspath(path))
    for d in (p, *p.parents):
        if (d / "meta.json").is_file():
            return d
    return None


def own_file_problem(path: str | os.PathLike, flag: str) -> str | None:
    """Why an output at ``path`` (a file, or a folder a command fills) would write a run's own files,
    or None: a path inside a run folder, except under its report/ folder."""
    p = Path(os.path.abspath(path))
    if any(a.exists() and not a.is_dir() for a in p.parents):
        return None  # under a file: the write itself fails, and its message names that
    run = run_folder_of(p if p.is_dir() else p.parent)
    if run is None:
        return None
    rel = p.relative_to(run).parts
    if rel[:1] and rel[0] in OUTPUT_FOLDERS:
        return None
    return (f"{flag} {str(path)!r} is inside the run folder {run}, whose files only the run writes; pass a path "
            f"outside it or under {run / OUTPUT_FOLDERS[0]}")


def check_outputs(**files: str | None) -> None:
    """Refuse outputs (keyword: the flag without dashes) that would write a run's own files, or two
    flags that name one file (one would write over the other). ``-`` (stdout) and None pass."""
    seen: dict[str, str] = {}
    for flag, name in files.items():
        if not name or name == "-":
            continue
        why = own_file_problem(name, f"--{flag}" if len(flag) > 1 else f"-{flag}")
        if why:
            raise UserError(why)
        key = os.path.realpath(name)
        if key in seen:
            raise UserError(f"--{seen[key]} and --{flag} both name {name!r}: one would write over the other; "
                            "pass two file names")
        seen[key] = flag


def argv_command() -> str:
    """This process's command line, shortened, for the lock's holder line."""
    args = [os.path.basename(sys.argv[0]) if sys.argv else "parbench", *sys.argv[1:4]]
    return " ".join(args) + (" ..." if len(sys.argv) > 4 else "")
