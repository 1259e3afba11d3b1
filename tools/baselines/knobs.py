"""The training knobs (optimizer, compilation, activation checkpointing) as both sides spell them.

The harness takes them as ``parbench run`` flags (``--optimizer sgd|adam|adamw``, ``--compile
off|on``, ``--ac none|full|selective``); the plain programs that implement them (``plain_ddp``,
``plain_fsdp``) as ``--optimizer NAME``, ``--compile`` (a switch) and ``--ac MODE``. This module
holds the choices, the defaults, the warm-up rule under compilation and the flags one setting
takes on each side, so that ``pairs.PAIRS`` and the plain programs agree. It imports neither torch
nor the harness: ``interleave.py`` builds commands with it without starting either.
"""

from __future__ import annotations

from dataclasses import dataclass

OPTIMIZERS = ("sgd", "adam", "adamw")
AC_MODES = ("none", "full", "selective")
DEFAULT_OPTIMIZER = "adamw"  # the harness's default
# SGD's rate is the harness's long-standing one (losses compare with older results); Adam's and
# AdamW's the usual 3e-4.
DEFAULT_LR = {"sgd": 1e-2, "adam": 3e-4, "adamw": 3e-4}
# Under --compile the first steps compile (forward and backward graphs, a recompilation when a guard
# first fails); they are left out, and SETTLE_STEPS more run untimed so that the allocator and the
# autotuned kernels have settled before the timed window.
COMPILE_STEPS = 2
SETTLE_STEPS = 5


def default_lr(optimizer: str) -> float:
    """The learning rate ``optimizer`` trains with when none is given."""
    return DEFAULT_LR[optimizer]


def warmup_steps(warmup: int, compiled: bool) -> int:
    """Untimed steps before the timed window: ``warmup`` eager; with compilation the compiling
    steps plus at least ``SETTLE_STEPS``."""
    return COMPILE_STEPS + max(warmup, SETTLE_STEPS) if compiled else warmup


@dataclass(frozen=True)
class Knobs:
    """One setting of the three knobs."""

    optimizer: str = "sgd"
    compile: bool = False
    ac: str = "none"

    def __post_init__(self) -> None:
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer {self.optimizer!r}: one of {', '.join(OPTIMIZERS)}")
        if self.ac not in AC_MODES:
            raise ValueError(f"ac {self.ac!r}: one of {', '.join(AC_MODES)}")

    def harness_flags(self) -> tuple[str, ...]:
        """``parbench run`` flags, FLAG VALUE pairs. The optimizer always (the harness's default is
        AdamW, so an SGD pair must say so); compile and AC only when not off, so that a checkout
        without those flags still runs the pairs that do not need them."""
        return (("--optimizer", self.optimizer) + (("--compile", "on") if self.compile else ())
                + (("--ac", self.ac) if self.ac != "none" else ()))

    def plain_flags(self) -> tuple[str, ...]:
        """The same setting as ``plain_ddp``'s / ``plain_fsdp``'s flags."""
        return (("--optimizer", self.optimizer) + (("--compile",) if self.compile else ())
                + (("--ac", self.ac) if self.ac != "none" else ()))


SGD = Knobs()
ADAMW = Knobs("adamw")
