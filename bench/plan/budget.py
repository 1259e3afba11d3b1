"""A time budget (``--budget``): the cost model of a group and of a cell, the plan that fits the
matrix into the budget, and the pacer that re-plans each group's time cap from the time left.
"""

from __future__ import annotations

import dataclasses

from bench.core import backends
from bench.core.errors import UserError
from bench.core.settings import RunConfig
from bench.core.spec import CellSpec, WorkloadFacts, deferred
from bench.plan.matrix import Group, Planned

#: What a budget plan assumes a torchrun group costs beyond its cells (start-up, the once-per-process
#: warm-up, teardown), by device: on 4 H100s the default matrix's groups take 21-25 s each from the
#: previous group's last cell to their first.
GROUP_START_S = {"cpu": 4.0, "cuda": 23.0}
#: What compiling costs a repeat of a compiled cell before its first timed step, by device, where
#: nothing measured says otherwise: gpt-200m on one H200 20-31 s (docs/evidence/search-grid-h200.csv,
#: knobs-memory-h200.csv), gpt-tiny on 2 CPU cores 19-44 s
COMPILE_S = {"cuda": 35.0, "cpu": 45.0}
#: What a cell costs beyond its timed steps (build, staging, 2 warm-up steps, one profiled step,
#: teardown): a base by device and backend ("multi-gpu": one process on several GPUs, as
#: DataParallel and layer splits are), plus seconds per billion parameters, since the steps and the
#: build grow with the model, and a share per extra rank, since a cell's barriers, gathers and
#: profiling wait for its slowest rank. Gloo's per-parameter term grows with its ring's traffic,
#: 2(n-1)/n of the gradients (its steps are its all-reduces over the host). Fitted on the default
#: matrix under its budget on 4 H100s (160 cells, a cell's wall time less its timed steps): NCCL
#: 0.57 / 0.60 / 0.93 s a cell for the small models at 1 / 2 / 4 ranks and 2.0 / 2.6 / 2.8 s for
#: gpt-200m (236 M parameters); Gloo 0.74 / 1.05 s for the small models at 2 / 4 ranks, 7.2 s for
#: gpt-200m at 2; one-process multi-GPU cells 0.7-0.9 s and 2.9-3.2 s. Without the rank term the
#: model is 25-35% short at 2 and 4 ranks.
#: The device's own figure covers a backend without a cost of its own; the backends' figures are
#: registry fields (bench.core.backends).
CELL_OVERHEAD_S = {"cpu": 1.0, "cuda": 0.6}
#: The seconds-per-billion-parameters terms scale with a step's work, not with the parameters alone:
#: a cell's overhead is mostly whole steps (the first, slow one, the warm-up, the profile pass's
#: unprofiled and profiled steps), and the build, per parameter, is cheap next to them. They were
#: fitted at gpt-200m's 419,370 FLOPs a parameter a step (64 sequences of 1024 tokens); a workload
#: counts as its parameters times its own FLOPs a parameter a step over that. gpt-20b's shape at
#: global batch 8 does 50,000: on 2 H200s its 20.3B parameters count as 2.4B, 32 s a cell with the
#: profile pass, against 35-40 s measured (23 s around 10 warm-up steps, 21-25 s of profile pass);
#: the parameters alone would give 260 s.
FITTED_FLOPS_PER_PARAM = 419_370.0


def step_work(w: WorkloadFacts) -> float | None:
    """A workload's step, in billions of parameters at the fitted FLOPs per parameter and step
    (:data:`FITTED_FLOPS_PER_PARAM`); its parameters when its FLOPs are unknown; None when both are."""
    if not w.params:
        return None
    if not w.flops_per_sample:
        return w.params / 1e9
    return w.flops_per_sample * w.global_batch / FITTED_FLOPS_PER_PARAM / 1e9


#: one-process multi-GPU cells (DataParallel, layer splits): seconds a cell, per billion parameters
MULTI_GPU_CELL_S, MULTI_GPU_PER_BPARAM_S = 0.7, 10.0


def cell_overhead(device: str, backend: str, one_process_gpus: int = 1, params: int | None = None,
                  ranks: int = 1, work: float | None = None) -> float:
    """What a budget plan assumes one cell costs beyond its timed steps (``one_process_gpus``: the
    GPUs a one-process cell drives, as DataParallel and layer splits do; ``params``: the workload's
    parameter count, None when unknown; ``ranks``: the cell's processes; ``work``: its step in
    billions of parameters at the fitted step (:func:`step_work`), by default its parameters). Gloo's
    ring term stays with the parameters: it moves the gradients."""
    base, per_rank, per_b, ring = CELL_OVERHEAD_S[device], 0.0, 0.0, 0.0
    if device == "cuda" and one_process_gpus > 1:
        base, per_b = MULTI_GPU_CELL_S, MULTI_GPU_PER_BPARAM_S
    elif device == "cuda" and backend in backends.REGISTRY:
        b = backends.get(backend)
        base = b.cuda_cell_s if b.cuda_cell_s is not None else base
        per_rank, per_b = b.cuda_per_rank_s, b.cuda_per_bparam_s
        if ranks > 1:
            ring = b.cuda_ring_per_bparam_s * 2 * (ranks - 1) / ranks
    bparams = (params or 0) / 1e9
    return base + per_rank * (ranks - 1) + per_b * (bparams if work is None else work) + ring * bparams



#: A cell whose profiled steps run in its group's profile pass (``--profile-at end``) is built a
#: second time and warmed up again: its overhead above times this. On CPU (gpt-tiny, gloo x2: DDP
#: 0.45 s of pass against 0.58 s of other overhead, FSDP 0.70 against 0.90) the pass is about 0.75 of
#: the rest. On 4 H100s (gpt-200m, 3 warm-up and 2 profiled steps, 3 runs each way) a cell's wall
#: time outside its timed steps is 1.61x (FSDP x4: 3.43 s against 2.12 s, medians) and 1.72x (the
#: single-GPU reference: 4.31 against 2.50) that of the same cell profiled inline; budget plans run
#: fewer warm-up and profiled steps, and the GPU model above runs 25% high on the default matrix,
#: so the factor is 1.5 until a GPU run of the default matrix refits it. A pass whose profiled step
#: is off the timed one runs again, and a build off it is built again (bench.train.profile); the
#: factor leaves those out (in a default run on 4 H200s 6 of 35 cells ran more than one pass, and
#: the run took 479 of its 600 s), and the run's deadline stops them.
PROFILE_PASS_FACTOR = 1.5


def _overhead(cfg, c: CellSpec) -> float:
    """What the budget assumes cell ``c`` costs beyond its timed steps, its profile pass included."""
    work = step_work(c.workload)
    if work is not None and c.scaling == "weak":
        work /= c.n_devices  # n devices each train one device's share of the n-times batch
    base = cell_overhead(cfg.matrix.device, c.backend, c.n_devices if c.n_procs == 1 else 1, c.workload.params,
                         ranks=c.n_procs, work=work)
    return base * (PROFILE_PASS_FACTOR if deferred(c) else 1.0)


def compile_cost(cfg, c: CellSpec) -> float:
    """Seconds compiled cell ``c`` spends compiling: COMPILE_S for each repeat (a repeat builds its
    model again from an empty dynamo cache); nothing for an eager cell."""
    return COMPILE_S[cfg.matrix.device] * max(c.measure.repeats, 1) if c.training.compile == "on" else 0.0


def fixed_cost(cfg, c: CellSpec) -> float:
    """What cell ``c`` costs beyond its timed steps: its overhead and its compilation."""
    return _overhead(cfg, c) + compile_cost(cfg, c)


def start_cost(cfg: RunConfig, g: Group) -> float:
    """What a group costs before its first cells are measured: its start-up and the overhead of
    its first three cells; a group that cannot spend this before the deadline is not started."""
    return GROUP_START_S[cfg.matrix.device] + sum(fixed_cost(cfg, c) for c in g.cells[:3])


def budget_plan(cfg: RunConfig, cells: list[Planned], budget_s: float,
                reserve: float = 0.0) -> tuple[list[Planned], str]:
    """Fit the run into ``budget_s``: fewer repeats if needed, then each cell's timed steps capped
    by time (at least 2 steps, 2 warm-up and at most 2 profiled steps; more timed steps while the
    interval is wide and time is left). The run's deadline cuts what still does not fit (those cells
    are skipped with that reason). A ``reserve`` share of the budget is left for the decisions still
    open after this pass (:mod:`bench.train.adaptive`). Returns the cells with their new settings and the plan in one
    sentence; UserError when the fixed costs alone are far beyond the budget."""
    runnable = [p for p in cells if p.reason is None]
    if not runnable:
        return cells, "nothing to run"
    n_groups = len({(p.spec.n_procs, p.spec.nnodes, p.spec.backend) for p in runnable})
    fixed = n_groups * GROUP_START_S[cfg.matrix.device] + sum(fixed_cost(cfg, p.spec) for p in runnable)
    if fixed > 1.5 * budget_s:
        raise UserError(f"budget {budget_s:g}s is too small for {len(runnable)} cells in {n_groups} process groups "
                        f"(about {fixed:.0f}s before any timed step); raise --budget or narrow the matrix")
    usable = 0.8 * budget_s * (1 - reserve) - fixed
    pinned = set(cfg.budget.pinned)  # the user's own settings stay as given
    repeats = cfg.measurement.repeats
    while "repeats" not in pinned and repeats > 1 and usable / (len(runnable) * repeats) < 0.5:
        repeats -= 1
    cap = max(usable / (len(runnable) * repeats), 0.1)
    if "time_cap_s" in pinned:
        cap = cfg.measurement.time_cap_s
    out = []
    for p in cells:
        m0 = p.spec.measure
        planned = dict(repeats=repeats, steps=min(m0.steps, 2), warmup=min(m0.warmup, 2),
                       steps_max=max(m0.steps_max, 500), warmup_max=min(m0.warmup_max, 10),
                       profile_steps=min(m0.profile_steps, 2), time_cap_s=cap)
        m = dataclasses.replace(m0, **{k: v for k, v in planned.items() if k not in pinned})
        out.append(dataclasses.replace(p, spec=dataclasses.replace(p.spec, measure=m)))
    least = min(p.spec.measure.steps for p in out if p.reason is None)
    stop = f"stops adding steps after {cap:.1f}s" if cap > 0 else "has no time cap (--time-cap 0)"
    if cfg.measurement.target_ci > 0:
        stop += f" (or when its interval is within {cfg.measurement.target_ci:.0%})"
    text = (f"budget {budget_s:g}s: {len(runnable)} cells x {repeats} repeat(s) in {n_groups} process group(s); "
            f"each repeat times at least {least} steps and {stop}; cells the deadline reaches are skipped"
            + (f"; repeats lowered from {cfg.measurement.repeats} to fit" if repeats < cfg.measurement.repeats else "")
            + (f"; kept as given: {', '.join(sorted(pinned))}" if pinned else "")
            + (f"; {reserve:.0%} of the budget kept for decisions still open" if reserve else "")
            + ("; tight: expect skipped cells" if usable <= 0 else ""))
    return out, text


class Pacer:
    """Re-plans a budgeted run's time cap before each process group from the time actually left.

    The plan's costs are a model (GROUP_START_S, CELL_OVERHEAD_S); a machine slower or faster than
    the one they were fitted on would end the run with cells skipped at the deadline, or with time
    unused. Before each group: the groups done so far give the pace (seconds they took over seconds
    the model gave them, 0.5-3), and 90% of the time remaining, divided by that pace, less the
    groups' modelled fixed costs, is shared among their cells' repeats as the cap (at least 0.1 s,
    at most twice the plan's). Dividing the whole by the pace charges it to the capped part too
    (warm-up may spend half a cap beyond the timed cap): with only the fixed costs scaled, capped
    slots that take 1.5 x their cap overrun a 600 s budget by about 22 s. Off for runs on several
    nodes: not tested there."""

    def __init__(self, cfg: RunConfig, groups: list[Group]):
        self.cfg, self.groups = cfg, groups
        caps = [c.measure.time_cap_s for g in groups for c in g.cells if c.measure.time_cap_s]
        self.planned = max(caps) if caps else 0.0
        self.modelled = self.spent = 0.0
        self._start: tuple[float, float] | None = None  # (seconds left, modelled cost) of the current group

    def fixed(self, g: Group) -> float:
        return GROUP_START_S[self.cfg.matrix.device] + sum(fixed_cost(self.cfg, c) for c in g.cells)

    @staticmethod
    def slots(g: Group) -> int:
        """The group's measurements that each get a cap: every repeat of every cell."""
        return sum(c.measure.repeats for c in g.cells)

    @property
    def pace(self) -> float:
        return min(max(self.spent / self.modelled, 0.5), 3.0) if self.modelled > 0 else 1.0

    def cap(self, gid: int, left_s: float) -> float:
        rest = self.groups[gid:]
        slots = sum(self.slots(g) for g in rest)
        if not slots or not self.planned:
            return self.planned
        usable = 0.9 * left_s / self.pace - sum(self.fixed(g) for g in rest)
        return min(max(usable / slots, 0.1), 2 * self.planned)

    def next_group(self, gid: int, left_s: float) -> Group:
        g = self.groups[gid]
        cap = self.cap(gid, left_s)
        cells = [dataclasses.replace(c, measure=dataclasses.replace(c.measure, time_cap_s=cap))
                 if c.measure.time_cap_s else c for c in g.cells]
        self._start = (left_s, self.fixed(g) + self.slots(g) * cap)
        return dataclasses.replace(g, cells=cells)

    def group_done(self, left_s: float, clean: bool = True) -> None:
        """The group ended with ``left_s`` of the budget left. A group that was not ``clean`` (a
        launch killed at a cell's timeout, or after a desynchronised error) does not count towards the
        pace: its time is gone from the budget all the same, but a hang says nothing about how fast
        the machine runs the groups left, and counting it would drive every later cap to the 0.1 s
        floor."""
        if self._start is not None:
            if clean:
                self.spent += self._start[0] - left_s
                self.modelled += self._start[1]
            self._start = None

