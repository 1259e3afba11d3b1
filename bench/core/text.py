"""Wording shared by the command line, the adaptive rounds and the reports."""

from __future__ import annotations


def counted(n: int, noun: str) -> str:
    """``n`` and the noun, plural unless n is 1: ``counted(1, "cell")`` is "1 cell", 3 is "3 cells"."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def lead(fraction: float, decimals_below: float = 0.0995) -> str:
    """A lead or gap as a signed percentage, one decimal below ``decimals_below`` (near a threshold,
    "+2.8%" and "+3.1%" must not both read "+3%" where a 3% band decides, nor -9.8% and -10.1% read
    "-10%" against a 10% limit): ``lead(0.028)`` is "+2.8%", ``lead(0.21)`` "+21%"."""
    return f"{fraction:+.1%}" if abs(fraction) < decimals_below else f"{fraction:+.0%}"


def gap_text(fraction: float) -> str:
    """A profiled step's gap to its timed one, judged against a 10% limit: one decimal up to 20%
    (``gap_text(-0.101)`` is "-10.1%", ``gap_text(0.39)`` "+39%")."""
    return lead(fraction, decimals_below=0.1995)
