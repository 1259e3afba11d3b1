"""A pytest plugin: benchmark one cell of your own model and strategy with pytest-benchmark.

Enable it with ``pytest -p bench.gate.pytest_plugin`` or, in a conftest.py, ``pytest_plugins =
["bench.gate.pytest_plugin"]``. Then::

    def test_my_model(parbench_cell):
        stats = parbench_cell("mypkg.models:factory", "ddp", steps=30, warmup=5)
        assert stats["throughput_samples_s"] > 100

Each timed step is one pytest-benchmark round (device-synchronised), so its statistics, its
storage (``--benchmark-autosave``, ``--benchmark-save``) and its gate (``--benchmark-compare
--benchmark-compare-fail=median:5%``) work on step times as on any benchmark. The cell runs in
the test's process at world size 1 (a one-rank Gloo group when the strategy uses a backend);
multi-rank cells are measured by ``parbench run`` and reach pytest-benchmark through
``parbench export RUN --format pytest-benchmark``.
"""

from __future__ import annotations

import dataclasses
import gc
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

import strategies
from bench.core import backends, knobs
from bench.core.errors import UserError
from bench.workloads import resolve
from strategies.base import Context


def _context(device: Any, **kw: Any) -> Any:
    """A one-rank strategies.base.Context, filling only the fields this version of it has."""

    names = {f.name for f in dataclasses.fields(Context)}
    base = dict(rank=0, world_size=1, local_rank=0, device=device, devices=(device,),
                backend=backends.default_for("cpu").name)
    return Context(**{k: v for k, v in {**base, **kw}.items() if k in names})


def _one_rank_group() -> bool:
    """Start a one-process group of the host's backend (Gloo) when none is up; True when this call
    started it."""
    import torch.distributed as dist

    if dist.is_initialized():
        return False
    dist.init_process_group(backends.default_for("cpu").name, store=dist.HashStore(), rank=0, world_size=1)
    return True


@dataclass(frozen=True, kw_only=True)
class BenchCell:
    """One world-size-1 cell the fixture times: what ``parbench_cell(workload, strategy, **kw)``
    takes. ``optimizer``, ``compile`` and ``ac`` are the training knobs (bench.core.knobs), ``lr``
    the learning rate (None: the optimizer's default). ``workload``: a name or
    ``package.module:factory`` spec, or a bench.workloads.Workload; ``strategy``: a registry name or
    ``package.module:Class``, or a strategies.base.Strategy."""

    workload: Any
    strategy: Any = "single"
    steps: int = 20
    warmup: int = 3
    device: str = "cpu"
    precision: str = "fp32"
    seed: int = 0
    lr: float | None = None
    optimizer: str = "adamw"
    compile: str = "off"
    ac: str = "none"
    global_batch: int | None = None
    options: dict[str, Any] | None = None


def run_cell(benchmark: Any, cell: BenchCell) -> dict[str, Any]:
    """Build ``cell``, warm it up, and time its steps as pytest-benchmark rounds. Returns the median
    step time, throughput and the cell's facts (also in ``extra_info``)."""
    import torch
    import torch.distributed as dist

    c = cell
    wl = resolve(c.workload, seed=c.seed, global_batch=c.global_batch) if isinstance(c.workload, str) else c.workload
    strat = strategies.get(c.strategy) if isinstance(c.strategy, str) else c.strategy
    dev = torch.device(c.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        pytest.skip("CUDA asked for but not available")
    if getattr(strat, "min_world", 1) > 1:
        raise UserError(f"strategy {strat.name!r} needs world size >= {strat.min_world}; the fixture runs world "
                        "size 1: use parbench run, then parbench export --format pytest-benchmark")
    started = _one_rank_group()  # strategies that use a backend need a group; the rest ignore it
    try:
        opts = dict(c.options or {})
        if hasattr(strat, "resolve_options"):  # declared options with their defaults, validated
            opts = strat.resolve_options(1, opts)
        chosen = knobs.validate({"optimizer": c.optimizer, "compile": c.compile, "ac": c.ac})
        training = knobs.combinations(chosen, c.lr)[0]
        ctx = _context(dev, seed=c.seed, precision=c.precision, training=training, options=opts)
        batches = [ctx.to_device(wl.batch(s)) for s in range(c.warmup + c.steps)]
        step = strat.prepare(wl, ctx)
        feed = iter(batches)

        def setup() -> tuple[tuple, dict]:
            return (next(feed),), {}

        def target(batch: Any) -> None:
            step.run(batch)
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)

        # One round per step, every step on its own batch, warm-up rounds untimed.
        benchmark.pedantic(target, setup=setup, rounds=c.steps, warmup_rounds=c.warmup, iterations=1)
    finally:
        # The model goes before the group it started: a DDP reducer still alive at
        # destroy_process_group can hold the group's last reference, and Gloo's teardown then joins
        # its work threads while one of them waits for the GIL to free that reducer's last work.
        step = feed = batches = None  # noqa: F841
        if started:
            gc.collect()
            dist.destroy_process_group()
    info = dict(workload=wl.name, strategy=strat.name, device=dev.type, precision=c.precision, **training.knobs(),
                global_batch=int(wl.global_batch), world_size=1)
    stats = getattr(benchmark, "stats", None)
    median = stats.stats.median if stats is not None and getattr(stats, "stats", None) else float("nan")
    info["step_time_median_s"] = median
    info["throughput_samples_s"] = wl.global_batch / median if median == median and median > 0 else float("nan")
    benchmark.extra_info.update(info)
    return info


@pytest.fixture
def parbench_cell(benchmark: Any) -> Callable[..., dict[str, Any]]:
    """``parbench_cell(workload, strategy="single", steps=20, warmup=3, device="cpu", ...)``: times
    one world-size-1 cell of any workload and strategy into this test's ``benchmark``."""

    def run(workload: Any, strategy: Any = "single", **kw: Any) -> dict[str, Any]:
        return run_cell(benchmark, BenchCell(workload=workload, strategy=strategy, **kw))

    return run
