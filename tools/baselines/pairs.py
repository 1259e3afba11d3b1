"""What ``interleave.py`` compares: each family's harness cell and plain program (the ``PAIRS`` table).

A family pairs a harness cell (a strategy, its ``--option``s and ``parbench run`` flags such as the
training knobs) with a plain program of this folder and its flags, configured alike. Edit ``PAIRS``
when harness options change: ``interleave.py`` drops, with a warning noted in its table, an option
the checkout's strategy does not declare or a run flag its ``parbench run`` does not have (the
harness refuses both).

The training knobs (``knobs.Knobs``: optimizer, compile, activation checkpointing) are given once
per family and spelled for each side by :func:`pair`: the harness gets ``--optimizer NAME`` always
(its default is AdamW) and ``--compile on`` / ``--ac MODE`` when set; ``plain_ddp`` and
``plain_fsdp`` get ``--optimizer NAME`` and ``--compile`` / ``--ac MODE``. ``plain_pipeline`` and
``plain_tp`` train with SGD only, eager, so their families are SGD on both sides.
"""

from __future__ import annotations

from dataclasses import dataclass

from tools.baselines.knobs import ADAMW, SGD, Knobs, warmup_steps

#: The plain programs that take the knob flags (--optimizer, --compile, --ac).
KNOB_PROGRAMS = ("plain_ddp", "plain_fsdp")


@dataclass(frozen=True)
class Pair:
    """One family: the harness cell (strategy, ``--option``s, run flags) and the plain program
    (module, flags)."""

    strategy: str
    options: tuple[str, ...]
    program: str
    flags: tuple[str, ...] = ()
    row_name: str | None = None  # the cells' `strategy` column, where ``strategy`` is a module:Class spec
    run_flags: tuple[str, ...] = ()  # `parbench run` flags besides --option, FLAG VALUE pairs
    one_device: bool = False  # world size 1 only: the harness's `single`, the plain program without a group

    @property
    def cell(self) -> str:
        return self.row_name or self.strategy

    @property
    def compiled(self) -> bool:
        """Whether both sides compile (``--compile on`` among the run flags)."""
        return dict(run_flag_items(self.run_flags)).get("--compile") == "on"


def run_flag_items(flags: tuple[str, ...] | list[str]) -> list[tuple[str, str]]:
    """``("--optimizer", "adamw", "--ac", "full")`` -> ``[("--optimizer", "adamw"), ("--ac", "full")]``."""
    if len(flags) % 2 or not all(f.startswith("--") for f in flags[::2]):
        raise ValueError(f"run flags {flags!r}: expected FLAG VALUE pairs")
    return list(zip(flags[::2], flags[1::2]))


def pair(strategy: str, options: tuple[str, ...], program: str, flags: tuple[str, ...] = (), *,
         knobs: Knobs = SGD, row_name: str | None = None) -> Pair:
    """A family trained with ``knobs`` on both sides: the harness's run flags and the plain
    program's flags of the same setting (a program without the knob flags takes SGD only)."""
    if program in KNOB_PROGRAMS:
        flags = (*flags, *knobs.plain_flags())
    elif knobs != SGD:
        raise ValueError(f"{program} trains with SGD, eager, no checkpointing only; not {knobs}")
    return Pair(strategy, tuple(options), program, tuple(flags), row_name, knobs.harness_flags(),
                one_device=strategy == "single")


# ---- the pairs: edit here ------------------------------------------------------------------------
# Harness options as declared by the strategies (each configured as its documentation does); the plain
# flags state the same configuration. Pipelines: 8 micro-batches and equal transformer blocks per stage
# on both sides (the harness's default pp_balance=blocks). The families before the knob block train with
# SGD, eager, no checkpointing, both sides (so that they compare as they always have).
_COMPILE, _AC, _SAC = Knobs("adamw", compile=True), Knobs("adamw", ac="full"), Knobs("adamw", ac="selective")
PAIRS: dict[str, Pair] = {
    "ddp": pair("ddp", (), "plain_ddp"),                                       # DDP defaults both sides
    "ddp-tuned": pair("ddp", ("bucket_mb=100", "ddp_grad_as_bucket_view=true", "ddp_static_graph=true"),
                      "plain_ddp", ("--bucket-mb", "100", "--grad-as-bucket-view", "--static-graph")),
    "fsdp": pair("fsdp", ("fsdp_mp=auto",), "plain_fsdp"),                    # bf16 params, fp32 reduce
    "fsdp-fp32": pair("fsdp", ("fsdp_mp=off",), "plain_fsdp", ("--no-mp",)),  # fp32 params + autocast
    "fsdp-noreshard": pair("fsdp-noreshard", ("fsdp_mp=auto",), "plain_fsdp", ("--no-reshard",)),
    "pipeline-gpipe": pair("pipeline-gpipe", ("micro_batches=8",), "plain_pipeline",
                           ("--schedule", "gpipe", "--micro-batches", "8", "--split", "equal")),
    "pipeline-1f1b": pair("pipeline-1f1b", ("micro_batches=8",), "plain_pipeline",
                          ("--schedule", "1f1b", "--micro-batches", "8", "--split", "equal")),
    # Both plans by their strategies' defaults (tensor: megatron; variants.TensorSP: sp), so the two
    # share a harness call (an --option tp_plan=... would apply to both).
    "tensor": pair("tensor", (), "plain_tp"),                                 # no sequence parallel
    "tensor-sp": pair("tools.baselines.variants:TensorSP", (), "plain_tp", ("--sequence-parallel",),
                      row_name="tensor-sp"),
    # The training knobs: AdamW (the harness's default optimizer), alone, with compilation, with full
    # and with selective activation checkpointing. single-*: one device, world size 1 only.
    "single-adamw": pair("single", (), "plain_ddp", ("--no-ddp",), knobs=ADAMW),
    "single-compile": pair("single", (), "plain_ddp", ("--no-ddp",), knobs=_COMPILE),
    "single-ac": pair("single", (), "plain_ddp", ("--no-ddp",), knobs=_AC),
    "single-sac": pair("single", (), "plain_ddp", ("--no-ddp",), knobs=_SAC),
    "ddp-adamw": pair("ddp", (), "plain_ddp", knobs=ADAMW),
    "ddp-compile": pair("ddp", (), "plain_ddp", knobs=_COMPILE),
    "ddp-ac": pair("ddp", (), "plain_ddp", knobs=_AC),
    "ddp-sac": pair("ddp", (), "plain_ddp", knobs=_SAC),
    "fsdp-adamw": pair("fsdp", ("fsdp_mp=auto",), "plain_fsdp", knobs=ADAMW),
    "fsdp-compile": pair("fsdp", ("fsdp_mp=auto",), "plain_fsdp", knobs=_COMPILE),
    "fsdp-ac": pair("fsdp", ("fsdp_mp=auto",), "plain_fsdp", knobs=_AC),
    "fsdp-sac": pair("fsdp", ("fsdp_mp=auto",), "plain_fsdp", knobs=_SAC),
}
DEFAULT_FAMILIES = "ddp,fsdp,pipeline-gpipe,pipeline-1f1b,tensor,tensor-sp"
# ---------------------------------------------------------------------------------------------------


def family_worlds(family: str, worlds: list[int]) -> list[int]:
    """The world sizes of ``worlds`` a family runs at: a one-device family at 1 only, any other at
    every one asked (a family unknown here, from an older result: every one)."""
    p = PAIRS.get(family)
    return [w for w in worlds if w == 1] if p is not None and p.one_device else list(worlds)


def group_worlds(families: list[str], worlds: list[int]) -> list[int]:
    """The world sizes a harness call of these families runs: those any member runs at."""
    return [w for w in worlds if any(w in family_worlds(f, worlds) for f in families)]


def harness_warmup(families: list[str], warmup: int) -> int:
    """The harness's warm-up for a call of these families: the plain programs' under the same
    knobs (with compilation ``knobs.warmup_steps`` extends it), so both sides leave the same steps
    untimed. The members of one call share their run flags, so one of them decides."""
    return warmup_steps(warmup, any(PAIRS[f].compiled for f in families))
