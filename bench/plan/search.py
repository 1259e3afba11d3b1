"""The knob search's plan: which configurations of the leading strategies a budgeted run measures
after its screening pass, which it never starts, and why.

The screening pass measures every strategy at its defaults. A user deploys more than a strategy: a
batch per device, a checkpointing policy, compile on or off, the strategy's own settings. Per
workload, backend and world size (a *slot*) the search takes the strategies that lead it (the
single-device reference alone at one device) and plans their variants as ordinary cells, through
the matrix's own planner (:class:`bench.plan.matrix.Planner`), so that a variant a strategy rejects
or the memory model says cannot fit is never started and says why:

* stage 0, the brief pass: every combination of activation checkpointing, the batch per device (the
  workload's global batch times each factor of the space, divided over the devices) and, one at a
  time, the values a strategy declares for the search (:attr:`strategies.catalog.Option.search`);
* stage 1: the compiled twin of each stage-0 configuration, started only for the configurations that
  lead their slot after stage 0 (compiling costs tens of seconds a cell, so it is tried where it can
  win; the answer says so);
* the single-device cells the parity check and the speed-ups of a candidate at several devices are
  read against (the same batch and training), planned beside them.

Nothing here starts a process (:mod:`bench.train.search` runs the stages).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import strategies
from bench.core import knobs
from bench.core.settings import RunConfig
from bench.core.spec import CellSpec
from bench.plan.matrix import Planned, Planner

#: (workload, backend, world size): what a search answers for
Slot = tuple[str, str, int]


@dataclass(frozen=True)
class Space:
    """What a search varies: checkpointing and compile values, factors of the batch per device, how
    many leading strategies a slot searches, how many of its stage-0 configurations go on to stage 1,
    and how many the final repeats decide between."""

    ac: tuple[str, ...]
    compile: tuple[str, ...]
    batch: tuple[float, ...]
    leaders: int
    keep: int
    final: int = 3

    def knobs(self) -> list[str]:
        """The knobs searched, in words for the report."""
        return ["activation checkpointing (" + ", ".join(self.ac) + ")",
                "torch.compile (" + ", ".join(self.compile) + ", on the stage-0 leaders)",
                "batch per device (x" + ", x".join(f"{f:g}" for f in self.batch) + " the workload's)",
                "the strategies' declared options (DDP bucket size, pipeline micro-batches)"]


SPACES = {
    "auto": Space(ac=("none", "selective", "full"), compile=("off", "on"), batch=(1, 2, 4), leaders=2, keep=3),
    "wide": Space(ac=("none", "selective", "full"), compile=("off", "on"), batch=(0.5, 1, 2, 4, 8), leaders=3,
                  keep=4),
}


@dataclass(frozen=True)
class Candidate:
    """A configuration the search may measure: its planned cell (with the reason it cannot run, if
    any), its slot, its stage, the stage-0 cell it is the compiled twin of, and whether it is a
    single-device cell other candidates are read against."""

    planned: Planned
    slot: Slot
    stage: int
    twin: int | None = None
    reference: bool = False
    column: int | None = None  # its place in the round-robin: every slot's k-th variant shares one

    @property
    def spec(self) -> CellSpec:
        return self.planned.spec

    @property
    def reason(self) -> str | None:
        return self.planned.reason


def describe(spec: CellSpec) -> str:
    """A configuration in words: 'fsdp, compile on, checkpointing full, 8 samples per device
    (global 16), bucket_mb=100'."""
    t = spec.training
    per = spec.workload.global_batch / max(spec.n_devices, 1)
    parts = [spec.strategy, f"compile {t.compile}", f"checkpointing {t.ac}", f"{per:g} samples per device"
             + (f" (global {spec.workload.global_batch})" if spec.n_devices > 1 else "")]
    searched = {o.name for o in strategies.get(spec.strategy_spec).options if o.search}
    parts += [f"{k}={v}" for k, v in sorted(spec.options.items()) if k in searched]
    return ", ".join(parts)


def _variants(base: CellSpec, space: Space) -> list[tuple[knobs.Training, int, dict[str, Any]]]:
    """The stage-0 configurations of ``base``: (training, global batch, option overrides), the base's
    own first, then in the order the brief pass affords them: the batch per device (what moves a
    step's throughput most), the strategy's searched options, checkpointing at the base batch, then
    checkpointing at the other batches (where it lets a larger batch fit)."""
    strat = strategies.get(base.strategy_spec)
    gb0, n = base.workload.global_batch, base.n_devices
    options: list[dict[str, Any]] = []
    for o in strat.options:
        options += [{o.name: v} for v in o.search if v != base.options.get(o.name)]
    acs = [a for a in space.ac if a != base.training.ac]
    batches = []
    for factor in sorted((f for f in space.batch if f != 1), key=lambda f: (f < 1, f)):
        gb = gb0 * factor
        if gb == int(gb) and gb >= n and int(gb) % n == 0:  # a whole number of samples on every device
            batches.append(int(gb))
    t0 = base.training
    out = [(t0, gb0, {})] + [(t0, gb, {}) for gb in batches] + [(t0, gb0, o) for o in options]
    out += [(dataclasses.replace(t0, ac=ac), gb, {}) for gb in [gb0, *batches] for ac in acs]
    return out


def plan(cfg: RunConfig, gpus: int, screened: list[Planned], leads: dict[Slot, list[int]], space: Space,
         first_id: int) -> list[Candidate]:
    """The candidates of every slot the screening pass (``screened``) measured, from the cells that
    lead it (``leads``: :func:`bench.decide.best.leaders`), their compiled twins and the
    single-device cells they are read against, each planned (cell ids from ``first_id``) and skipped
    with its reason where a strategy or the memory model rejects it. Configurations the screening
    pass measured are not planned again."""
    specs = {p.spec.cell_id: p.spec for p in screened}
    planner = Planner(cfg, gpus, first_id)
    planner.seen = {_key(s) for s in specs.values()}
    per_rank: dict[int, list[list[Candidate]]] = {}
    for slot, ids in leads.items():
        for rank, cid in enumerate(ids):
            base = specs.get(cid)
            if base is None:
                continue  # a row the plan has no cell for (another run's, resumed): nothing to vary
            per_rank.setdefault(rank, []).append(_slot_candidates(planner, slot, base, space))
    # round-robin over the slots, first leaders (what each answer starts from) before second ones: a
    # budget that cuts the brief pass cuts every slot's least promising variants, not one slot whole
    out: list[Candidate] = []
    for rank in sorted(per_rank):
        first = max((c.column for c in out), default=-1) + 1
        out += [dataclasses.replace(c, column=first + c.column) for c in _round_robin(per_rank[rank])]
    refs = _references(planner, cfg, out)
    return _with_memory(cfg, out + refs)


def _round_robin(lists: list[list[Candidate]]) -> list[Candidate]:
    """Every list's first item, then every list's second, and so on, each with its column: its
    place among its own list's candidates of its stage (a base's k-th stage-0 variant, or its k-th
    compiled twin), so that a column is every slot's k-th candidate of one stage."""
    staged = []
    for x in lists:
        count: dict[int, int] = {}
        mine = []
        for c in x:
            mine.append(dataclasses.replace(c, column=count.get(c.stage, 0)))
            count[c.stage] = count.get(c.stage, 0) + 1
        staged.append(mine)
    return [x[k] for k in range(max(map(len, staged), default=0)) for x in staged if k < len(x)]


def _key(spec: CellSpec) -> tuple:
    """What the planner tells cells apart by (:meth:`Planner.add`)."""
    return (spec.workload.name, spec.strategy, spec.backend, spec.n_devices, spec.workload.global_batch,
            spec.training, tuple(sorted((k, v) for k, v in spec.options.items() if v is not None)))


def _add(planner: Planner, base: CellSpec, training: knobs.Training, gb: int,
         options: dict[str, Any]) -> Planned | None:
    strat = strategies.get(base.strategy_spec)
    opts = {k: v for k, v in {**base.options, **options}.items() if v is not None}
    facts = dataclasses.replace(base.workload, global_batch=gb)
    before = len(planner.cells)
    planner.add(base.strategy_spec, strat, facts, base.backend, base.n_devices, [base.backend], training,
                options=opts)
    return planner.cells[before] if len(planner.cells) > before else None


def _slot_candidates(planner: Planner, slot: Slot, base: CellSpec, space: Space) -> list[Candidate]:
    """Stage 0 of ``base`` (its variants not yet planned) and stage 1, each stage-0 configuration's
    compiled twin (the base's own included)."""
    out: list[Candidate] = []
    twins: list[tuple[int, knobs.Training, int, dict]] = []
    for training, gb, extra in _variants(base, space):
        p = _add(planner, base, training, gb, extra)
        if p is not None:
            out.append(Candidate(planned=p, slot=slot, stage=0))
            twins.append((p.spec.cell_id, training, gb, extra))
        elif (training, gb, extra) == (base.training, base.workload.global_batch, {}):
            twins.append((base.cell_id, training, gb, extra))  # the screened cell itself
    for twin, training, gb, extra in twins:
        for value in space.compile:
            if value == training.compile:
                continue
            p = _add(planner, base, dataclasses.replace(training, compile=value), gb, extra)
            if p is not None:
                out.append(Candidate(planned=p, slot=slot, stage=1, twin=twin))
    return out


def _references(planner: Planner, cfg: RunConfig, cands: list[Candidate]) -> list[Candidate]:
    """The single-device cells the candidates at several devices are read against (parity and
    speed-up: the same workload, global batch and training), where the plan has none."""
    single = strategies.get("single")
    out = []
    for c in cands:
        s = c.spec
        if s.n_devices < 2 or c.reason is not None or cfg.matrix.scaling != "strong":
            continue
        before = len(planner.cells)
        planner.add("single", single, s.workload, planner.one_proc_backend, 1, cfg.matrix.backends, s.training,
                    options={})
        for p in planner.cells[before:]:
            out.append(Candidate(planned=p, slot=(s.workload.name, p.spec.backend, 1), stage=c.stage, twin=None,
                                 reference=True))
    return out


def _with_memory(cfg: RunConfig, cands: list[Candidate]) -> list[Candidate]:
    """The candidates with the memory model's prediction, skipped where it says they cannot fit (on
    one node: every node of a run plans the same matrix)."""
    if cfg.nodes.nnodes != 1 or not cands:
        return cands
    from bench.plan.memory import device_memory, predict_cells, probing

    memory = device_memory(cfg.matrix.device)
    predicted = predict_cells([c.planned for c in cands], device=cfg.matrix.device, memory=memory or None,
                              probe=probing(cfg.profiling.memory_probe, cfg.matrix.device))
    return [dataclasses.replace(c, planned=p) for c, p in zip(cands, predicted)]


def first_pass(cands: list[Candidate]) -> list[Candidate]:
    """Stage 0's runnable candidates and the references they need, in the order :func:`plan` gave
    them (round-robin over the slots' leaders), which is the order they are afforded in."""
    return [c for c in cands if c.stage == 0 and c.reason is None]


def promoted(fastest: dict[Slot, set[int]], cands: list[Candidate]) -> list[Candidate]:
    """Stage 1: the compiled twins of each slot's fastest measured configurations (``fastest``: the
    screened base and stage 0's, by cell id), and the references they need."""
    out = [c for c in cands if c.stage == 1 and not c.reference and c.twin in fastest.get(c.slot, set())]
    refs = [c for c in cands if c.reference and c.stage == 1 and any(_reads(c.spec, o.spec) for o in out)]
    return out + refs


def _reads(ref: CellSpec, cell: CellSpec) -> bool:
    """Whether the single-device ``ref`` is what ``cell`` is read against."""
    return (ref.workload.name == cell.workload.name and ref.workload.global_batch == cell.workload.global_batch
            and ref.training == cell.training)


def afford(cands: list[Candidate], left_s: float, cost) -> tuple[list[Candidate], list[Candidate]]:
    """(the candidates that fit ``left_s`` in order, with 25% to spare; the rest), ``cost`` giving a
    candidate's seconds. A candidate at several devices goes with its reference: neither runs alone.
    Candidates of one column (:attr:`Candidate.column`: every slot's k-th variant) fit whole or not
    at all, and the columns after one that does not fit are left out too: a run and its re-run on a
    machine a few percent faster or slower measure the same candidates, not one slot's more."""
    run: list[Candidate] = []
    spent = 0.0
    by_ref = {c.spec.cell_id: c for c in cands if c.reference}
    taken: set[int] = set()
    columns: dict[Any, list[Candidate]] = {}
    for i, c in enumerate(cands):
        if not c.reference:
            columns.setdefault(("col", c.column) if c.column is not None else ("own", i), []).append(c)
    rest: list[Candidate] = []
    closed = False  # a column did not fit: none after it is started
    for members in columns.values():
        need, placed, mine = 0.0, [], set()  # each member with the references it brings
        for c in members:
            refs = [r for r in by_ref.values() if r.spec.cell_id not in taken | mine
                    and _reads(r.spec, c.spec)] if c.spec.n_devices > 1 else []
            need += cost(c) + sum(cost(r) for r in refs)
            placed += [c, *refs]
            mine |= {r.spec.cell_id for r in refs}
        if closed or 1.25 * (spent + need) > left_s:
            rest += members  # a candidate of no column leaves the next free to fit
            closed = closed or members[0].column is not None
            continue
        spent += need
        run += placed
        taken |= mine
    return run, rest


def wider_minutes(cands: list[Candidate], cost) -> float:
    """What measuring every candidate that could run would take, in minutes (the report's 'a wider
    search would take')."""
    return math.ceil(sum(cost(c) for c in cands if c.reason is None) / 6) / 10
