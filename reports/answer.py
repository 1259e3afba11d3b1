"""The recommendation as a reader sees it, in the same words on the report's first screen and at
the end of ``parbench run``: what to use (or that there is no decision), whether it is decided, why,
what was measured, and what to try next; launch-bound (toy) workloads apart from the rest.
"""

from __future__ import annotations

from bench.core.text import lead
from bench.decide.recommend import Pick, first_screen
from bench.decide.rules import EQUIVALENT

#: why a launch-bound workload's pick is kept off the first screen
LAUNCH_BOUND_WHY = ("the single-device step is under 10 ms or mostly idle: it measures kernel launches and "
                    "Python more than the strategy, so these picks say little about a real model")


def split(picks: list[Pick]) -> tuple[list[Pick], list[Pick]]:
    """(picks of real workloads, picks of launch-bound ones), each in first-screen order."""
    ordered = first_screen(picks)
    return [p for p in ordered if not p.launch_bound], [p for p in ordered if p.launch_bound]


def use_text(p: Pick) -> str:
    """The answer: a strategy, 'one device', or 'no decision'."""
    if p.use is None:
        return "no decision"
    return "one device" if p.use == "single" else p.use


def decided_text(p: Pick) -> str:
    """'decided', 'leading, not decided (what would decide it)' or 'no' (there is no answer: the use
    column says so, and the because column why)."""
    if p.use is None:
        return "no"
    return "decided" if p.resolved else f"leading, not decided ({p.open_text()})"


def noise_text(p: Pick) -> str:
    """Whether the fastest is ahead of the runner-up beyond the noise."""
    if p.significant is None:
        return "one run: not judged"
    if p.significant and p.same_speed:
        return f"beyond the noise, within {EQUIVALENT:.0%}: the same speed"
    return "beyond the noise" if p.significant else "within the noise"


def measured_text(p: Pick) -> str:
    """What was measured: the fastest candidate, its step, its speed-up, its lead."""
    out = f"fastest: {p.winner} {p.step_ms:.1f} ms/step"
    if p.speedup is not None:
        out += f", {p.speedup:.2f}x one device"
    if p.runner_up is not None and p.margin is not None:
        out += f"; {lead(p.margin)} ahead of {p.runner_up} ({noise_text(p)})"
    return out


def next_text(p: Pick) -> str:
    """What to try when nothing scales ('' when it does: an undecided pick already says what decides it)."""
    return p.next_step


def lines(p: Pick) -> list[str]:
    """The pick as a few short lines for a terminal: the answer first, then what was measured and
    what to try next (what was left out is in the report, and failed parity in the run's summary)."""
    head = f"{p.title}: "
    if p.use is None:
        first = head + f"no decision: {p.because}"
    elif p.resolved:
        first = head + f"use {use_text(p)}: {p.because}"
    else:
        first = head + f"{use_text(p)} leads, not decided ({p.open_text()}): {p.because}"
    out = [first, f"{measured_text(p)}; {p.why}"]
    if next_text(p):
        out.append(f"next: {next_text(p)}")
    return out
