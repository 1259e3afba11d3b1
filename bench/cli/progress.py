"""Progress over the matrix, to stderr so stdout stays clean for tables.

On a terminal it is a rich progress bar. Without one (stderr a log file or a pipe) a bar is never
drawn, and nothing would show until the end: there it is one line per group started and per cell
finished, with how far the matrix is and the time since it started.

It is one consumer of the launcher's progress callback (:class:`bench.train.group.Progress`); the
launcher itself draws nothing.
"""

from __future__ import annotations

import time

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

from bench.core.text import counted


class MatrixProgress:
    """Takes the launcher's progress events; ``console`` (default: stderr) decides bar or lines."""

    def __init__(self, *, enabled: bool = True, console: Console | None = None):
        self.enabled = enabled
        self.console = console or Console(stderr=True)
        self.lines = not self.console.is_terminal
        self.progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), console=self.console, disable=not enabled or self.lines)
        self.task = self.progress.add_task("matrix", total=None)
        self._group = ""
        self._live = False
        self._total, self._done, self._t0 = 0, 0, time.monotonic()

    def __enter__(self) -> MatrixProgress:
        return self  # drawn from the plan event on: a plan that fails leaves nothing on the terminal

    def __exit__(self, *exc) -> None:
        if self._live:
            self.progress.__exit__(*exc)

    def __call__(self, p) -> None:
        """Take one :class:`bench.train.group.Progress` event."""
        if not self.enabled:
            return
        if self.lines:
            self._line(p)
            return
        if p.kind == "plan":
            self.progress.update(self.task, total=p.n)
            self.progress.__enter__()
            self._live = True
        elif p.kind == "more":
            self.progress.update(self.task, total=(self.progress.tasks[0].total or 0) + p.n)
        elif p.kind == "note":
            self.progress.console.print(escape(p.text), highlight=False)
        elif p.kind == "group":
            self._group = p.group
            text = f"{p.group}: starting torchrun ({counted(p.n, 'cell')})"
            self.progress.update(self.task, description=escape(text))
        elif p.kind == "start":
            c = p.cell
            self.progress.update(self.task, description=escape(f"{self._group}: {c.strategy} {c.workload.name} "
                                                               f"ws={c.n_devices}"))
        elif p.kind == "done":
            self.progress.advance(self.task)

    def _line(self, p) -> None:
        """One plain line per event that changes what a reader of the log should know; a cell's start
        is left out (its end follows)."""
        if p.kind == "plan":
            self._total, self._t0 = p.n, time.monotonic()
            text = f"parbench: {p.n} cells to run"
        elif p.kind == "more":
            self._total += p.n
            return
        elif p.kind == "note":
            text = p.text
        elif p.kind == "group":
            text = f"{self._stamp()} {p.group}: starting torchrun ({counted(p.n, 'cell')})"
        elif p.kind == "done":
            self._done += 1
            text = f"{self._stamp()} {p.cell.title}: {p.status}"
        else:
            return
        self.console.print(Text(text), soft_wrap=True)

    def _stamp(self) -> str:
        """'[ 12/99  3:04]': cell runs finished of those planned (adaptive rounds add theirs),
        minutes:seconds since the plan."""
        m, s = divmod(int(time.monotonic() - self._t0), 60)
        width = len(str(self._total or self._done))
        return f"[{self._done:>{width}}/{self._total} {m:>2}:{s:02d}]"
