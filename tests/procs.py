"""What a test says when a process it started fails: the last few lines of its output, and the
whole output in a file the failure names. Ranks under torchrun write a traceback each, prefixed
with their rank; pasted whole into an assertion message they bury pytest's summary."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

TAIL_LINES = 8


def output_dir() -> Path:
    d = Path(os.environ.get("PARBENCH_TEST_OUTPUT_DIR") or Path(tempfile.gettempdir()) / "parbench-test-output")
    d.mkdir(parents=True, exist_ok=True)
    return d


def saved(name: str, *texts: str | None, tail: int = TAIL_LINES) -> str:
    """Writes ``texts`` (stdout, stderr, ...) to one file named after ``name`` and returns a short
    message for an assertion: the file's path and the last ``tail`` lines."""
    text = "\n".join(t for t in texts if t)
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:80]
    fd, path = tempfile.mkstemp(prefix=f"{safe}-", suffix=".log", dir=output_dir())
    with os.fdopen(fd, "w") as f:
        f.write(text)
    lines = [ln for ln in text.splitlines() if ln.strip()][-tail:]
    return f"full output in {path}; last {len(lines)} lines:\n" + "\n".join(lines)
