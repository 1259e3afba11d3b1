"""Wording shared by the command line, the adaptive rounds and the reports."""

from __future__ import annotations


def counted(n: int, noun: str) -> str:
    """``n`` and the noun, plural unless n is 1: ``counted(1, "cell")`` is "1 cell", 3 is "3 cells"."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def lead(fraction: float) -> str:
    """A lead or gap as a signed percentage, one decimal under 10% (where a 3% band decides, "+2.8%"
    and "+3.1%" must not both read "+3%"): ``lead(0.028)`` is "+2.8%", ``lead(0.21)`` "+21%"."""
    return f"{fraction:+.1%}" if abs(fraction) < 0.0995 else f"{fraction:+.0%}"
