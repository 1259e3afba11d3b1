"""Output folders checked before any work: one probe for every command that writes a folder."""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path


def folder_problem(path: str | os.PathLike) -> str | None:
    """Create ``path`` (with its parents) and write a probe file in it: None when that worked, else
    why not, in a few words ("it is a file", "a part of the path is a file", the OS's reason)."""
    p = Path(path)
    try:
        if p.exists() and not p.is_dir():
            return "it is a file"
        p.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=p, prefix=".parbench-probe-"):
            pass
    except OSError as e:
        return "a part of the path is a file" if e.errno in (errno.ENOTDIR, errno.EEXIST) else (e.strerror or str(e))
    return None
