"""The run's matrix: every cell of (workload, strategy, backend, world size), runnable or skipped
with its reason, and the cells grouped into the process groups that run them.

Every node of a multi-node run plans the same matrix (:func:`bench.multinode.plan_digest` checks
it); nothing here starts a process.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import strategies
from bench.core import backends, knobs
from bench.core.config import parse_workload
from bench.core.errors import UserError
from bench.core.metrics import Metric, registry
from bench.core.settings import RunConfig
from bench.core.spec import ONE_RANK_SKIP, CellSpec, Measure, WorkloadFacts
from bench.measure.hardware import cpu_threads
from bench.plan.memory import device_memory, memory_reason, predict_cells, probing
from bench.workloads import Workload, planned
from strategies.base import policy_text


@dataclass(frozen=True, kw_only=True)
class Planned:
    """A cell of the matrix: runnable (reason None) or skipped with its reason."""

    spec: CellSpec
    reason: str | None


@dataclass(kw_only=True)
class Group:
    """The cells one torchrun runs: ``n_procs`` processes of one backend over ``nnodes`` nodes."""

    n_procs: int
    backend: str
    cells: list[CellSpec] = field(default_factory=list)
    nnodes: int = 1

    @property
    def label(self) -> str:
        return f"{self.backend} x{self.n_procs}" + (f" on {self.nnodes} nodes" if self.nnodes > 1 else "")


def expand_strategies(specs: list[str]) -> list[tuple[str, strategies.Strategy]]:
    """(spec, strategy) for each asked strategy, 'all' expanded, duplicates dropped."""
    flat: list[str] = []
    for s in specs:
        flat.extend(strategies.names() if s == "all" else [s])
    out: dict[str, tuple[str, strategies.Strategy]] = {}
    for sp in flat:
        strat = strategies.get(sp)
        out.setdefault(strat.name, (sp, strat))
    return list(out.values())


def validate_options(given: dict[str, Any], strats: list[strategies.Strategy]) -> None:
    """Every ``--option`` key is declared by a strategy of the run and parses as its type."""
    declared = {o.name: o for s in strats for o in s.options}
    for key, value in given.items():
        if key not in declared:
            known = ", ".join(sorted(declared)) or "none (no strategy of this run takes options)"
            raise UserError(f"option {key!r} is not an option of the strategies in this run; known: {known}")
        try:
            declared[key].parse(value)
        except ValueError as e:
            raise UserError(str(e)) from None


def plan_devices(device: str, n_devices: int, nnodes: int = 1) -> tuple[int, ...]:
    """The CUDA indices a cell of ``n_devices`` runs on, on each of its ``nnodes`` nodes: the first
    n / nnodes visible GPUs (torchrun binds local rank r to the r-th); nothing else in the harness
    derives device ids."""
    return tuple(range(n_devices // nnodes)) if device == "cuda" else ()


def cell_nodes(cfg: RunConfig, n_procs: int) -> int:
    """Nodes a cell spans: one-process cells run on node 0 alone, the others on every node."""
    return cfg.nodes.nnodes if n_procs > 1 else 1


def profile_when(cfg: RunConfig) -> str:
    """When the cells' profiled steps run (``Measure.profile_at``): ``--profile-at auto`` is "end" on
    CUDA, where a GPU profiler session slows the process's later work (bench.train.profile.profile_cell),
    and "inline" on CPU, where there is no such effect to avoid and the pass's rebuild would only
    cost time."""
    if cfg.profiling.profile_at == "auto":
        return "end" if cfg.matrix.device == "cuda" else "inline"
    return cfg.profiling.profile_at


def check_strategy_names(cfg: RunConfig, run: set[str]) -> None:
    """The strategies [backend_strategies] names are strategies; those [workload_matrix] names are
    strategies of the run (``run``: their names)."""
    lists = [(f"backend_strategies.{be}", names, None) for be, names in (cfg.matrix.backend_strategies or {}).items()]
    lists += [(f'[workload_matrix."{wl}"] strategies', n.get("strategies", []), run)
              for wl, n in (cfg.matrix.workload_matrix or {}).items()]
    for where, names, within in lists:
        unknown = [n for n in names if n not in strategies.names()]
        if unknown:
            raise UserError(f"{where}: unknown strategy {unknown[0]!r}; see `parbench list`")
        outside = [n for n in names if within is not None and n not in within]
        if outside:
            raise UserError(f"{where}: {outside[0]!r} is not among the run's strategies; add it to the run's "
                            "or drop it here")


def planned_workloads(cfg: RunConfig) -> tuple[dict[str, Workload],
                                                list[tuple[Workload, WorkloadFacts, dict[str, list]]]]:
    """The run's workloads by name, and each one (duplicates dropped) with its facts and its
    [workload_matrix] narrowing."""
    wls: dict[str, Workload] = {}
    parsed: list[tuple[Workload, WorkloadFacts, dict[str, list]]] = []
    for text in cfg.matrix.workloads:
        name, dims = parse_workload(text)
        wl, facts = planned(name, dims, seed=cfg.matrix.seed, global_batch=cfg.matrix.global_batch,
                            timeout_s=cfg.measurement.workload_timeout_s)
        if cfg.measurement.parity_tol is not None:  # the run's tolerance over the workload's own
            facts = dataclasses.replace(facts, parity_tol=cfg.measurement.parity_tol)
        if wl.name not in wls:
            wls[wl.name] = wl
            parsed.append((wl, facts, (cfg.matrix.workload_matrix or {}).get(text, {})))
    return wls, parsed


def plan(cfg: RunConfig, gpus: int) -> tuple[list[Planned], dict[str, Workload], list[Metric]]:
    """Every cell of the matrix, each runnable or skipped with its reason; the workloads by name;
    the run's column registry. A single-device reference cell is added for every workload and
    every combination of the training knobs: parity and scaling efficiency need it. A user's
    workload gets ``cfg.measurement.workload_timeout_s`` to import, build and describe itself
    (:func:`bench.workloads.planned`)."""
    wls, parsed = planned_workloads(cfg)
    strats = expand_strategies(cfg.matrix.strategies)
    check_strategy_names(cfg, {s.name for _, s in strats})
    if not any(s.name == "single" for _, s in strats):
        strats.insert(0, ("single", strategies.get("single")))
    validate_options(cfg.matrix.options, [s for _, s in strats])
    planner = Planner(cfg, gpus)
    # A strategy of "all" at one device would measure its wrapper around the single-device step: a
    # legitimate question, not a default one; named, it runs.
    named = {strategies.get(s).name for s in cfg.matrix.strategies if s != "all"}
    for _wl, base, narrow in parsed:
        for sp, strat in strats:
            if "strategies" in narrow and strat.name not in narrow["strategies"] and strat.name != "single":
                continue  # not asked of this workload (matrix.workload_matrix)
            here = narrow.get("backends", cfg.matrix.backends)  # this workload's backends
            for backend in cfg.matrix.backends if not strat.one_process else [planner.one_proc_backend]:
                if backend in planner.only and strat.name not in planner.only[backend] and strat.name != "single":
                    continue  # not asked of this backend (matrix.backend_strategies)
                if backend not in here and strat.name != "single":
                    continue  # not asked of this workload (matrix.workload_matrix)
                # Weak scaling: the single-device reference runs every global batch a cell trains,
                # so that each cell has a parity reference of its own batch.
                asked = [n for n in cfg.matrix.world_sizes if n in narrow.get("world_sizes", cfg.matrix.world_sizes)]
                weak = cfg.matrix.scaling == "weak"
                sizes = (asked if strat.name != "single" else ([1] if not weak else sorted(set(asked))))
                for n in sizes:
                    if n == 1 and strat.name != "single" and strat.name not in named:
                        continue
                    facts = dataclasses.replace(base, global_batch=base.global_batch * (n if weak else 1))
                    for training in planner.trainings:
                        planner.add(sp, strat, facts, backend, 1 if strat.name == "single" else n, here, training)
    metrics = registry(m for _, s in strats for m in s.columns())
    cells = uncompared(planner.cells)
    if cfg.nodes.nnodes == 1:
        memory = planner.memory if planner.memory is not None else (device_memory(cfg.matrix.device) or 0)
        cells = predict_cells(cells, device=cfg.matrix.device, memory=memory or None,
                              probe=probing(cfg.profiling.memory_probe, cfg.matrix.device))
    return cells, wls, metrics


def uncompared(cells: list[Planned]) -> list[Planned]:
    """``cells`` with each reference of a workload that no runnable multi-device cell trains marked
    not compared: nothing reads its rounding (a one-GPU machine's whole run), so it is not measured."""
    multi = {p.spec.workload.name for p in cells if p.reason is None and p.spec.n_devices > 1
             and p.spec.role != "reference"}
    return [Planned(spec=dataclasses.replace(p.spec, compared=False), reason=p.reason)
            if p.spec.role == "reference" and p.spec.workload.name not in multi else p for p in cells]


class Planner:
    """The cells planned so far and what every cell of the run shares (its measurement, the
    training combinations, the one-process backend, the device's memory, read once)."""

    def __init__(self, cfg: RunConfig, gpus: int, first_id: int = 0):
        self.cfg, self.gpus, self.first_id = cfg, gpus, first_id
        m = cfg.measurement
        self.measure = Measure(steps=m.steps, warmup=m.warmup, profile_steps=cfg.profiling.profile_steps,
                               precision=cfg.effective_precision(), seed=cfg.matrix.seed, repeats=m.repeats,
                               warmup_max=m.warmup_max or 0, settle=m.settle, steps_max=m.steps_max or 0,
                               target_ci=m.target_ci, time_cap_s=m.time_cap_s, profile_at=profile_when(cfg))
        self.trainings = knobs.combinations(cfg.training.knobs or knobs.defaults(), cfg.training.lr)
        self.one_proc_backend = backends.for_one_process(cfg.matrix.device, cfg.matrix.backends)
        self.only = cfg.matrix.backend_strategies or {}
        self.cells: list[Planned] = []
        self.seen: set[tuple] = set()
        self.memory: int | None = None
        # the single-device reference trains under the default policy (strategies.base.Strategy.precision_policy)
        self.reference_policy = policy_text(self.measure.precision, cast_params=False)

    def add(self, sp: str, strat: strategies.Strategy, facts: WorkloadFacts, backend: str, n: int,
            here: list[str], training: knobs.Training, policy_reference: bool = False,
            options: dict[str, Any] | None = None) -> Planned | None:
        """The cell (workload ``facts``, strategy, backend, ``n`` devices, training, the run's
        ``--option`` values unless ``options`` are given), runnable or skipped with its reason, unless
        it is planned already; a ``policy_reference`` (a one-device cell of a strategy's own precision
        policy) only when it can run. Returns what it planned (None when nothing)."""
        cfg = self.cfg
        nodes = cell_nodes(cfg, strat.procs(n))
        mine = {o.name for o in strat.options}
        given = {k: v for k, v in (cfg.matrix.options if options is None else options).items() if k in mine}
        key = (facts.name, strat.name, backend, n, facts.global_batch, training, tuple(sorted(given.items())))
        if key in self.seen:
            return None
        self.seen.add(key)
        reason = None
        try:
            options = strat.resolve_options(n, given)
        except ValueError as e:
            options, reason = {}, str(e)
        cell = CellSpec(cell_id=self.first_id + len(self.cells), workload=facts, strategy=strat.name, strategy_spec=sp,
                        backend=backend, device=cfg.matrix.device, n_devices=n, n_procs=strat.procs(n),
                        devices=plan_devices(cfg.matrix.device, n, nodes), options=options, labels={},
                        role=strat.role, measure=self.measure, scaling=cfg.matrix.scaling, nnodes=nodes,
                        training=training)
        reason = reason or strat.check(cell, gpus=self.gpus) or strat.knob_reason(cell)
        if reason is None and strat.procs(n) == 1 and backend != self.one_proc_backend \
                and self.one_proc_backend in here:
            reason = (f"{ONE_RANK_SKIP}: its {backend} cell would repeat the "
                      f"{self.one_proc_backend} one, which is measured")
        if reason is None and cfg.matrix.device == "cpu" and n // nodes > cpu_threads() * 4:
            reason = f"{n // nodes} ranks per node > 4 x {cpu_threads()} CPU threads"
        # Every node plans the same matrix (bench.multinode.plan_digest): a run over
        # several nodes, whose memories may differ, skips nothing for memory.
        if reason is None and cfg.nodes.nnodes == 1:
            if self.memory is None and facts.train_bytes:
                self.memory = device_memory(cfg.matrix.device) or 0
            reason = memory_reason(cell, strat.min_share(cell), self.memory, strat.state_share(cell))
        cell = dataclasses.replace(cell, precision_policy=strat.precision_policy(cell))
        if reason is None:
            cell = dataclasses.replace(cell, labels=strat.label_values(cell))
        elif policy_reference:
            return None  # a one-device cell of the policy that cannot run measures nothing to read against
        planned = Planned(spec=cell, reason=reason)
        self.cells.append(planned)
        if (reason is None and n > 1 and cfg.matrix.scaling == "strong"
                and cell.precision_policy != self.reference_policy):
            # its speed-up is read against one device under its own precision policy (bench.results.derived)
            self.add(sp, strat, facts, backend, 1, here, training, policy_reference=True, options=given)
        return planned


def group(cells: list[Planned]) -> list[Group]:
    """Runnable cells grouped by (nodes, processes, backend), one-process groups first, the
    reference first in its group."""
    groups: dict[tuple[int, int, str], Group] = {}
    for p in cells:
        if p.reason is not None:
            continue
        c = p.spec
        groups.setdefault((c.n_procs, c.nnodes, c.backend),
                          Group(n_procs=c.n_procs, backend=c.backend, nnodes=c.nnodes)).cells.append(c)
    for g in groups.values():
        g.cells.sort(key=lambda c: (c.role != "reference", c.cell_id))
    first_backend = {c.spec.backend for c in cells if c.spec.role == "reference"}
    return [groups[k] for k in sorted(groups, key=lambda k: (k[0], k[1], k[2] not in first_backend, k[2]))]


def runnable(cells: list[Planned]) -> int:
    """How many of the planned cells run (have no skip reason)."""
    return sum(p.reason is None for p in cells)
