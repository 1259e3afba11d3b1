"""The ranks' event files of one launch (``PREFIX-r<rank>.jsonl``), read as they grow."""

from __future__ import annotations

from pathlib import Path

from bench.core import spec


class EventReader:
    """Reads new, complete lines from every rank's event file of one launch, as typed events. Files
    are named by global rank (``PREFIX-r<rank>.jsonl``); on a node of a multi-node run its ranks
    are not 0..n-1, so the files are found by name."""

    def __init__(self, prefix: str, nproc: int = 0):
        self.prefix = prefix
        self.offsets: dict[Path, int] = {}

    def lines(self) -> list[str]:
        """New complete lines, as JSON text."""
        out: list[str] = []
        for p in sorted(Path(self.prefix).parent.glob(Path(self.prefix).name + "-r*.jsonl")):
            with open(p) as f:
                f.seek(self.offsets.get(p, 0))
                data = f.read()
            complete = data[: data.rfind("\n") + 1]
            self.offsets[p] = self.offsets.get(p, 0) + len(complete)
            out.extend(line for line in complete.splitlines() if line.strip())
        return out

    def poll(self) -> list[spec.Event]:
        return [spec.load_event(line) for line in self.lines()]
