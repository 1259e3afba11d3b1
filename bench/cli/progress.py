"""The rich progress bar over the matrix (to stderr, so stdout stays clean for tables).

It is one consumer of the launcher's progress callback (:class:`bench.train.group.Progress`); the
launcher itself draws nothing.
"""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


class MatrixProgress:
    def __init__(self, *, enabled: bool = True):
        self.enabled = enabled
        self.progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), console=Console(stderr=True), disable=not enabled)
        self.task = self.progress.add_task("matrix", total=None)
        self._group = ""
        self._live = False

    def __enter__(self) -> MatrixProgress:
        return self  # drawn from the plan event on: a plan that fails leaves nothing on the terminal

    def __exit__(self, *exc) -> None:
        if self._live:
            self.progress.__exit__(*exc)

    def __call__(self, p) -> None:
        """Take one :class:`bench.train.group.Progress` event."""
        if p.kind == "plan":
            self.progress.update(self.task, total=p.n)
            self.progress.__enter__()
            self._live = True
        elif p.kind == "note":
            self.progress.console.print(escape(p.text), highlight=False)
        elif p.kind == "group":
            self._group = p.group
            self.progress.update(self.task, description=escape(f"{p.group}: starting torchrun ({p.n} cells)"))
        elif p.kind == "start":
            c = p.cell
            self.progress.update(self.task, description=escape(f"{self._group}: {c.strategy} {c.workload.name} "
                                                               f"ws={c.n_devices}"))
        elif p.kind == "done":
            self.progress.advance(self.task)
