"""Wording shared by the command line, the adaptive rounds and the reports."""

from __future__ import annotations


def counted(n: int, noun: str) -> str:
    """``n`` and the noun, plural unless n is 1: ``counted(1, "cell")`` is "1 cell", 3 is "3 cells"."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"
