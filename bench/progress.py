"""The rich progress bar over the matrix (to stderr, so stdout stays clean for tables)."""

from __future__ import annotations

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


class MatrixProgress:
    def __init__(self, *, total: int, enabled: bool = True):
        self.enabled = enabled
        self.progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), console=Console(stderr=True), disable=not enabled)
        self.task = self.progress.add_task("matrix", total=total)
        self._group = ""

    def __enter__(self) -> "MatrixProgress":
        self.progress.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.__exit__(*exc)

    def group(self, label: str, n: int) -> None:
        self._group = label
        self.progress.update(self.task, description=f"{label}: starting torchrun ({n} cells)")

    def event(self, kind: str, cell) -> None:
        if kind == "start":
            self.progress.update(self.task, description=f"{self._group}: {cell.strategy} {cell.workload} "
                                                        f"ws={cell.world_size}")
        elif kind == "done":
            self.progress.advance(self.task)
