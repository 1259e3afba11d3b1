"""What a ``parbench serve`` run does: the settings, checked, and the load levels they expand to."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from bench.core.errors import UserError
from bench.measure.hardware import cpu_threads
from bench.serve.launcher import PLACEMENTS
from bench.serve.loadgen import Tenant, parse_tenants
from bench.serve.policies import POLICIES

#: rates the sweep climbs at most before it bisects (each doubling the last)
SWEEP_LADDER = 6


@dataclass(kw_only=True)
class Load:
    """One load level: open loop (tenants' rates scaled to ``rate``) or closed loop (``clients``)."""

    label: str
    scenario: str  # levels | sweep | noisy-alone | noisy-flood
    tenants: list[Tenant]
    clients: int = 0
    rate: float = 0.0


#: The longest --cell-timeout: a week (past it a wait's deadline overflows the platform's timers).
CELL_TIMEOUT_MAX_S = 7 * 86400.0


def cpu_processes_max() -> int:
    """Most serving processes on CPU (processes as devices): 4 per CPU thread, as for comm's ranks;
    past it they crawl, and each holds a model and a Python interpreter in memory."""
    return 4 * cpu_threads()


#: Requests one open-loop cell may hold: all of them are drawn before it starts (without a cap,
#: --rates 1e9 for 1 s would draw a billion requests and exhaust the launcher's memory).
MAX_CELL_REQUESTS = 1_000_000


#: --graphs values: auto (CUDA graphs where a replica can replay them), off (eager)
GRAPHS = ("auto", "off")
#: the placements whose processes are single-GPU replicas, which replay graphs under --graphs auto
GRAPHED_PLACEMENTS = ("replicas", "pinned-tenants")


@dataclass(kw_only=True)
class ServeConfig:
    workload: str = "gpt-tiny"
    dims: dict[str, int] = field(default_factory=dict)
    task: str = "auto"
    gen_tokens: int = 8
    placements: list[str] = field(default_factory=lambda: ["replicas"])
    policies: list[str] = field(default_factory=lambda: ["round-robin", "jsq"])
    world_sizes: list[int] = field(default_factory=lambda: [2])
    device: str = "cpu"
    precision: str = "auto"
    seed: int = 0
    rates: list[float] = field(default_factory=lambda: [20.0])
    clients: list[int] = field(default_factory=list)
    tenants: list[Tenant] = field(default_factory=lambda: [Tenant()])
    duration_s: float = 5.0
    max_requests: int = 0  # 0: as many as the duration holds
    batch_max: int = 8
    batch_wait_ms: float = 5.0
    slo_ms: float = 0.0  # > 0: run the rate sweep against this p99 target
    sweep_rates: list[float] = field(default_factory=list)
    noisy: bool = False
    noisy_rates: tuple[float, float] = (5.0, 50.0)  # victim, flood
    slow: dict[int, float] = field(default_factory=dict)  # process -> seconds added per batch
    parity: bool = True
    graphs: str = "auto"  # auto: a CUDA replica replays its forward from CUDA graphs; off: eager
    sample_hz: float = 10.0
    cell_timeout_s: float = 600.0
    workload_timeout_s: float = 120.0  # a package.module:factory workload's import, factory and build
    out: str = "results"

    def graphs_for(self, placement: str, task: str) -> bool:
        """Whether ``placement``'s processes replay their forward from CUDA graphs: under --graphs
        auto on CUDA, single-GPU replicas that score or classify (a generating request's KV cache
        grows each step, nn.DataParallel scatters over devices, and a pipeline's stages hand
        activations over the host: those run eagerly)."""
        return (self.graphs == "auto" and self.device == "cuda" and placement in GRAPHED_PLACEMENTS
                and task != "generate")

    def sweep_ladder(self) -> list[float]:
        """The rates the sweep tries: given, or doubling from the lowest load level's rate."""
        if self.sweep_rates:
            return sorted(self.sweep_rates)
        start = min(self.rates) if self.rates else 10.0
        return [start * 2**k for k in range(SWEEP_LADDER)]

    def check(self) -> None:
        """Every setting against what a run can do; a one-line UserError naming the value otherwise."""
        self._check_names()
        self._check_numbers()
        self._check_load()
        for t in self.tenants:
            t.check()
        if self.slo_ms:
            self._check_sweep()

    def _check_names(self) -> None:
        for p in self.placements:
            if p not in PLACEMENTS:
                raise UserError(f"--placements has {p!r}; use a comma list of {', '.join(PLACEMENTS)}")
        for p in self.policies:
            if p not in POLICIES:
                raise UserError(f"--policies has {p!r}; use a comma list of {', '.join(POLICIES)}")
        if self.device not in ("cpu", "cuda"):
            raise UserError(f"--device {self.device!r} must be cpu or cuda")
        if self.precision not in ("auto", "fp32", "bf16"):
            raise UserError(f"--precision {self.precision!r} must be auto, fp32 or bf16")
        if self.graphs not in GRAPHS:
            raise UserError(f"--graphs {self.graphs!r} must be {' or '.join(GRAPHS)}")
        if self.task not in ("auto", "score", "generate", "classify"):
            raise UserError(f"--task {self.task!r} must be auto, score, generate or classify")

    def _check_numbers(self) -> None:
        bad = [w for w in self.world_sizes if w < 1]
        if bad:
            raise UserError(f"--world-sizes {bad[0]} must be a positive number of devices, e.g. 2,4")
        if self.device == "cpu" and self.world_sizes and max(self.world_sizes) > cpu_processes_max():
            raise UserError(f"--world-sizes {max(self.world_sizes)}: more serving processes than 4 x "
                            f"{cpu_threads()} CPU threads on this host (each holds a model); use at most "
                            f"{cpu_processes_max()} here, e.g. --world-sizes 2")
        if not 0 <= self.seed < 2**63:
            raise UserError(f"--seed {self.seed} must be between 0 and 2**63 - 1, e.g. --seed 0")
        if not (0 < self.cell_timeout_s <= CELL_TIMEOUT_MAX_S):
            raise UserError(f"--cell-timeout {self.cell_timeout_s:g} must be a positive number of seconds up to "
                            f"{CELL_TIMEOUT_MAX_S:g}, e.g. 600")
        if not (0 < self.workload_timeout_s <= CELL_TIMEOUT_MAX_S):
            raise UserError(f"--workload-timeout {self.workload_timeout_s:g} must be a positive number of seconds "
                            f"up to {CELL_TIMEOUT_MAX_S:g}, e.g. 120")
        if not (0 < self.duration_s < math.inf):
            raise UserError(f"--duration {self.duration_s:g} must be a positive, finite number of seconds, e.g. 5")
        if self.max_requests < 0 or self.max_requests > MAX_CELL_REQUESTS:
            raise UserError(f"--requests {self.max_requests} must be between 1 and {MAX_CELL_REQUESTS:,} "
                            "(0 or left out: as many as --duration holds)")
        if self.batch_max < 1:
            raise UserError(f"--batch-max {self.batch_max} must be >= 1 request, e.g. --batch-max 8")
        if not 0 <= self.batch_wait_ms < self.cell_timeout_s * 1e3:
            raise UserError(f"--batch-wait-ms {self.batch_wait_ms:g} must be >= 0 and shorter than --cell-timeout, "
                            "e.g. --batch-wait-ms 5")
        if self.gen_tokens < 1:
            raise UserError(f"--gen-tokens {self.gen_tokens} must be >= 1")
        if not (self.slo_ms >= 0 and math.isfinite(self.slo_ms)):
            raise UserError(f"--slo-ms {self.slo_ms:g} must be a positive p99 target in ms (0 or left out: no sweep), "
                            "e.g. --slo-ms 100")
        if not (self.sample_hz == 0 or 0.01 <= self.sample_hz <= 1000):
            raise UserError(f"--sample-hz {self.sample_hz:g} must be 0 (off) or from 0.01 to 1000, e.g. --sample-hz 10")
        for proc, s in self.slow.items():
            if not (0 <= proc < max(self.world_sizes, default=1) and 0 <= s < math.inf):
                raise UserError(f"--slow {proc}={s * 1e3:g}: PROCESS must be 0..{max(self.world_sizes, default=1) - 1} "
                                "(a process of the largest --world-sizes) and MS >= 0, e.g. --slow 1=20")

    def _check_load(self) -> None:
        for flag, rates in (("--rates", self.rates), ("--sweep-rates", self.sweep_rates),
                            ("--noisy-rates", list(self.noisy_rates))):
            bad = [r for r in rates if not 0 < r < math.inf]
            if bad:
                raise UserError(f"{flag} {bad[0]:g}: rates must be positive requests per second, e.g. 10,40,80")
        if self.sweep_rates and not self.slo_ms:
            raise UserError("--sweep-rates needs a latency target to sweep against; add --slo-ms, e.g. --slo-ms 100")
        if any(c < 1 for c in self.clients):
            raise UserError(f"--clients {min(self.clients)} must be a positive number of clients, e.g. 1,4")
        if not (self.rates or self.clients):
            raise UserError("give --rates or --clients: at least one load level")
        # every arrival of an open-loop cell is drawn before it starts: bound what one cell holds
        rates = self.rates + self.sweep_rates + list(self.noisy_rates if self.noisy else [])
        most, least = max(rates, default=0.0), min(rates, default=0.0)
        if not self.max_requests and most * self.duration_s > MAX_CELL_REQUESTS:
            raise UserError(f"--rates {most:g} for --duration {self.duration_s:g} s is {most * self.duration_s:.3g} "
                            f"requests in one cell, more than {MAX_CELL_REQUESTS:,}; lower the rate or the duration")
        if rates and not self.max_requests and least * self.duration_s < 1:
            raise UserError(f"--rates {least:g} for --duration {self.duration_s:g} s is less than one request in a "
                            "cell; raise the rate or the duration")
        if rates and self.max_requests and self.max_requests / least > self.cell_timeout_s:
            raise UserError(f"--requests {self.max_requests} at --rates {least:g} arrive over about "
                            f"{self.max_requests / least:.3g} s, longer than --cell-timeout {self.cell_timeout_s:g} s; "
                            "raise the rate or lower --requests")

    def _check_sweep(self) -> None:
        # a sweep point passes on its p99: a first point too short to report one ends the sweep
        # at once with no answer (n = 43 at 10 req/s for 5 s ran and exited 0)
        from bench.stats.serving import min_samples

        first, need = self.sweep_ladder()[0], min_samples(99.0)
        n = self.max_requests or int(first * self.duration_s)
        if n < need:
            raise UserError(f"--slo-ms {self.slo_ms:g}: the sweep's first point ({first:g} req/s"
                            + (f" for --duration {self.duration_s:g} s" if not self.max_requests else "")
                            + f") holds {n} requests and a p99 needs {need}; pass --requests 700"
                            + ("" if self.max_requests else " or a longer --duration"))

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["tenants"] = [asdict(t) for t in self.tenants]
        return d

    def levels(self) -> list[Load]:
        """The load levels every (placement, policy) is measured at."""
        loads = [Load(label=f"{_arrivals(self.tenants)}@{r:g}/s", scenario="levels", tenants=scaled(self.tenants, r),
                      rate=r) for r in self.rates]
        loads += [Load(label=f"closed@{c}", scenario="levels", tenants=self.tenants, clients=c) for c in self.clients]
        return loads

    def sweep_loads(self, rates: list[float]) -> list[Load]:
        return [Load(label=f"{_arrivals(self.tenants)}@{r:g}/s", scenario="sweep", tenants=scaled(self.tenants, r),
                     rate=r) for r in rates]

    def noisy_loads(self) -> list[Load]:
        """A victim tenant alone, then with a flooding neighbour (its rate, bursty)."""
        victim = replace(self.tenants[0], name="victim", rate=self.noisy_rates[0])
        flood = replace(self.tenants[0], name="flood", rate=self.noisy_rates[1], arrival="gamma")
        return [Load(label=f"victim@{victim.rate:g}/s", scenario="noisy-alone", tenants=[victim], rate=victim.rate),
                Load(label=f"victim@{victim.rate:g}+flood@{flood.rate:g}/s", scenario="noisy-flood",
                     tenants=[victim, flood], rate=victim.rate + flood.rate)]


def _arrivals(tenants: list[Tenant]) -> str:
    kinds = sorted({t.arrival for t in tenants})
    return "+".join(kinds) if len(tenants) == 1 else f"{len(tenants)}tenants-{'+'.join(kinds)}"


def scaled(tenants: list[Tenant], total: float) -> list[Tenant]:
    """The tenants with their rates scaled to sum to ``total`` (their ratios kept)."""
    s = sum(t.rate for t in tenants)
    return [replace(t, rate=t.rate * total / s) for t in tenants]


def tenants_from(text: str | None, default: Tenant) -> list[Tenant]:
    return parse_tenants(text, default=default) if text else [default]
