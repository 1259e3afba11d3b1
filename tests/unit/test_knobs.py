"""The training knobs: declared once (bench.core.knobs), planned as cells, applied by the strategies
(strategies.training), read back with their legacy values, compared by name."""

import subprocess
import sys

import pandas as pd
import pytest
import torch

from bench.core import knobs
from bench.core.config import build_config
from bench.core.errors import UserError
from bench.plan.matrix import plan
from bench.results.derived import derive
from bench.results.migrate import upgrade
from bench.workloads import resolve
from strategies.base import Context
from strategies.training import checkpoint_blocks, checkpointed_forwards, inner_blocks, make_optimizer, reset_counts


def _ctx(**training) -> Context:
    return Context(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), devices=(torch.device("cpu"),),
                   backend="gloo", seed=0, precision="fp32",
                   training=knobs.combinations(knobs.validate(training), None)[0])


def test_defaults_are_adamw_eager_no_checkpointing_with_each_optimizers_lr():
    [t] = knobs.combinations(knobs.defaults(), None)
    assert (t.optimizer, t.compile, t.ac, t.lr) == ("adamw", "off", "none", 3e-4)
    [s] = knobs.combinations(knobs.validate({"optimizer": "sgd"}), None)
    assert s.lr == 1e-2
    assert knobs.combinations(knobs.validate({"optimizer": "sgd"}), 0.5)[0].lr == 0.5
    assert knobs.legacy() == {"optimizer": "sgd", "compile": "off", "ac": "none"}


def test_comma_lists_expand_to_every_combination_in_order():
    combos = knobs.combinations(knobs.validate({"compile": "off,on", "ac": ["none", "full"]}), None)
    assert [(t.compile, t.ac) for t in combos] == [("off", "none"), ("off", "full"), ("on", "none"), ("on", "full")]


@pytest.mark.parametrize("given, words", [
    ({"optimizer": "lamb"}, ["--optimizer 'lamb' unknown", "adamw, adam, sgd"]),
    ({"ac": []}, ["--ac", "give one or more of none, full, selective"]),
    ({"compiled": "on"}, ["unknown knob 'compiled'", "optimizer, compile, ac"]),
])
def test_bad_knob_values_are_one_line_errors_naming_the_value(given, words):
    with pytest.raises(UserError) as e:
        knobs.validate(given)
    assert all(w in str(e.value) for w in words) and "\n" not in str(e.value)


def test_flags_and_toml_reach_the_config():
    cfg = build_config(toml={"training": {"ac": ["full"]}}, flags={"device": "cpu", "training": {"compile": "on"}},
                       gpus=0)
    # a flag replaces its knob's TOML value, the other TOML knobs stay
    cfg2 = build_config(toml={"training": {"ac": ["full"], "compile": ["off"]}},
                        flags={"device": "cpu", "training": {"ac": ["full"], "compile": "on"}}, gpus=0)
    assert cfg.training.knobs == {"optimizer": ["adamw"], "compile": ["on"], "ac": ["none"]}
    assert cfg2.training.knobs == {"optimizer": ["adamw"], "compile": ["on"], "ac": ["full"]}


def test_every_combination_is_planned_with_its_own_reference():
    cfg = build_config(toml=None, flags={"device": "cpu", "workloads": "gpt-tiny", "strategies": "ddp",
                                         "world_sizes": "2", "training": {"optimizer": "adamw,sgd"}}, gpus=0)
    cells, _, _ = plan(cfg, 0)
    got = sorted((p.spec.strategy, p.spec.training.optimizer) for p in cells)
    assert got == [("ddp", "adamw"), ("ddp", "sgd"), ("single", "adamw"), ("single", "sgd")]
    assert all(p.reason is None for p in cells)
    assert {p.spec.training.lr for p in cells if p.spec.training.optimizer == "sgd"} == {1e-2}


def test_a_strategy_that_cannot_compile_is_skipped_with_its_reason():
    cfg = build_config(toml=None, flags={"workloads": "gpt-tiny", "strategies": "dataparallel",
                                         "world_sizes": "2", "training": {"compile": "on", "ac": "none,full"}},
                       gpus=2)
    cells, _, _ = plan(cfg, 2)
    dp = [p for p in cells if p.spec.strategy == "dataparallel"]
    assert len(dp) == 2 and all(p.reason.startswith("compile=on: nn.DataParallel") for p in dp)


def test_fsdp_under_its_bf16_policy_gets_a_one_device_cell_of_that_policy():
    cfg = build_config(toml=None, flags={"workloads": "gpt-tiny", "strategies": "fsdp,ddp", "backends": "nccl",
                                         "world_sizes": "2"}, gpus=2)
    cells, _, _ = plan(cfg, 2)
    by = {(p.spec.strategy, p.spec.n_devices): p.spec for p in cells if p.reason is None}
    assert by[("fsdp", 2)].precision_policy == "bf16 params, fp32 reduce"
    assert by[("single", 1)].precision_policy == "fp32 params, bf16 autocast"
    assert ("fsdp", 1) in by and ("ddp", 1) not in by


def _recompute(ac: str) -> tuple[int, int, int]:
    """(inner block forward calls in one forward and backward, tensors the outer graph saved,
    matrix products run during backward) of gpt-tiny under ``ac``."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class CountMM(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.__name__.split(".")[0] in ("mm", "addmm", "bmm"):
                CountMM.n += 1
            return func(*args, **(kwargs or {}))

    wl = resolve("gpt-tiny")
    model = wl.build(torch.device("cpu"))
    calls = [0]
    for b in inner_blocks(wl, model):
        # counts the block's forward, also when the checkpoint calls it again in backward
        b.forward = (lambda f: lambda *a, **k: (calls.__setitem__(0, calls[0] + 1), f(*a, **k))[1])(b.forward)
    checkpoint_blocks(inner_blocks(wl, model), ac)
    saved = [0]
    x, y = wl.batch(0)
    with torch.autograd.graph.saved_tensors_hooks(lambda t: (saved.__setitem__(0, saved[0] + 1), t)[1], lambda t: t):
        loss = wl.loss(model(x), y)
    with CountMM():
        loss.backward()
    return calls[0], saved[0], CountMM.n


def test_full_checkpointing_recomputes_each_block_and_selective_keeps_the_matmuls():
    blocks = len(inner_blocks(resolve("gpt-tiny"), resolve("gpt-tiny").build(torch.device("meta"))))
    none_calls, none_saved, none_mm = _recompute("none")
    full_calls, full_saved, full_mm = _recompute("full")
    sel_calls, sel_saved, sel_mm = _recompute("selective")
    assert none_calls == blocks and full_calls == sel_calls == 2 * blocks  # forward again in backward
    assert full_saved < none_saved and sel_saved < none_saved
    assert sel_mm < full_mm  # selective recomputes no matrix product: its backward runs fewer
    assert sel_mm == none_mm


@pytest.mark.parametrize("ac", ["full", "selective"])
def test_compiled_checkpointed_blocks_compile_once_and_are_counted(ac):
    """Regional compile over checkpointed blocks, as the strategies apply them: later steps reuse
    the first step's graphs (a guard on the count recompiled every step until dynamo's limit sent
    the blocks back to eager), and the traced checkpointed forwards are still counted."""
    torch._dynamo.reset()
    reset_counts()
    wl = resolve("gpt-tiny")
    model = wl.build(torch.device("cpu"))
    blocks = inner_blocks(wl, model)
    checkpoint_blocks(blocks, ac)
    for b in blocks:
        b.compile(backend="eager")  # dynamo's guards are what is tested, not inductor's code
    x, y = wl.batch(0)
    wl.loss(model(x), y).backward()
    traced = checkpointed_forwards()
    with torch._dynamo.config.patch(error_on_recompile=True):
        for _ in range(3):
            wl.loss(model(x), y).backward()
    torch._dynamo.reset()
    assert traced >= 1


#: a module global read inside a compiled function: dynamo guards on its value (as it did on the
#: checkpointing wrapper's counter), so every change recompiles
_CALLS = {"n": 0}


def test_recompiles_and_the_recompile_limit_are_read_from_dynamo():
    """bench.train.timed.recompile_counts on dynamo's own counters: a guard on a global that every
    call changes builds graphs after the first, and past the limit dynamo gives the frame up."""
    from bench.core.spec import RankMeasurement
    from bench.train.timed import compile_counts, recompile_counts

    def f(x):
        _CALLS["n"] += 1
        return x * _CALLS["n"]

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    g = torch.compile(f, backend="eager")
    out = RankMeasurement(rank=0)
    with torch._dynamo.config.patch(recompile_limit=3):
        g(torch.ones(2))
        compile_counts(out)
        for _ in range(5):
            g(torch.ones(2))
        recompile_counts(out)
    torch._dynamo.reset()
    assert out.compiled_graphs == 1 and out.timed_graphs >= 1 and out.recompile_limit


def test_the_optimizer_knob_picks_the_torch_optimizer_fused_only_on_cuda():
    p = [torch.nn.Parameter(torch.ones(3))]
    assert type(make_optimizer(p, _ctx(optimizer="sgd"))) is torch.optim.SGD
    opt = make_optimizer(p, _ctx())
    assert type(opt) is torch.optim.AdamW and not opt.defaults.get("fused")
    assert opt.defaults["lr"] == 3e-4
    assert type(make_optimizer(p, _ctx(optimizer="adam"))) is torch.optim.Adam


def _cells(**over):
    base = dict(cell_id=0, mode="train", workload="w", strategy="single", backend="gloo", device="cpu",
                world_size=1, status="ok", role="reference", precision="fp32", throughput_samples_s=100.0,
                global_batch=8)
    return {**base, **over}


def test_runs_recorded_before_the_knobs_read_as_sgd_eager_no_checkpointing():
    cells, done = upgrade(pd.DataFrame([_cells(), _cells(cell_id=1, mode="serve")]))
    assert "training knobs of runs before them" in done
    assert list(cells.loc[0, ["optimizer", "compile", "ac"]]) == ["sgd", "off", "none"]
    assert pd.isna(cells.loc[1, "optimizer"])


def test_scaling_is_read_against_a_reference_of_the_same_knobs_and_policy():
    rows = [_cells(optimizer="adamw", precision_policy="fp32 params, bf16 autocast", throughput_samples_s=100.0),
            _cells(cell_id=1, optimizer="sgd", precision_policy="fp32 params, bf16 autocast",
                   throughput_samples_s=50.0),
            _cells(cell_id=2, strategy="fsdp", role="", optimizer="adamw", precision_policy="bf16 params, fp32 reduce",
                   throughput_samples_s=120.0),
            _cells(cell_id=3, strategy="fsdp", role="", world_size=2, optimizer="adamw",
                   precision_policy="bf16 params, fp32 reduce", throughput_samples_s=180.0),
            _cells(cell_id=4, strategy="ddp", role="", world_size=2, optimizer="sgd",
                   precision_policy="fp32 params, bf16 autocast", throughput_samples_s=90.0)]
    cells = derive(pd.DataFrame(rows), pd.DataFrame())
    eff = dict(zip(cells["cell_id"], cells["scaling_efficiency"]))
    assert eff[3] == pytest.approx(180 / (2 * 120))  # fsdp x2 against fsdp x1: the same policy
    assert eff[4] == pytest.approx(90 / (2 * 50))  # ddp (sgd) against the sgd reference
    assert "precision policy" in cells.loc[cells["cell_id"] == 2, "scaling_note"].iloc[0]


def test_run_rejects_a_bad_knob_with_exit_2_and_one_line():
    out = subprocess.run([sys.executable, "-m", "bench", "run", "--device", "cpu", "--compile", "maybe"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip().count("\n") == 0 and "--compile 'maybe' unknown" in out.stderr


def test_the_memory_bound_counts_adams_state_where_the_strategy_keeps_it():
    """AdamW's two fp32 values per parameter join the parameters and gradients in the plan's lower
    bound: 60 GiB of values and gradients fit 80 GiB under SGD, not under AdamW (+60 GiB), and fit
    again when ZeRO-1 shards the state over 4 devices (+15 GiB)."""
    from bench.core.spec import WorkloadFacts
    from bench.plan.memory import memory_reason

    gib = 2**30
    facts = WorkloadFacts(name="w", spec="w", dims={}, global_batch=8, flops_per_sample=None, params=int(7.5 * gib),
                          n_blocks=1, n_heads=None, has_tp_plan=False, description="", train_bytes=60 * gib,
                          trainable_bytes=30 * gib)

    class Cell:
        workload, device, nnodes, n_devices = facts, "cuda", 1, 4

    for optimizer, state_share, fits in (("sgd", 1.0, True), ("adamw", 1.0, False), ("adamw", 0.25, True)):
        Cell.training = knobs.Training(optimizer=optimizer)
        reason = memory_reason(Cell(), 1.0, 80 * gib, state_share)
        assert (reason is None) == fits, (optimizer, reason)
    assert "and adamw state" in memory_reason(Cell(), 1.0, 80 * gib)


def test_a_run_recorded_before_the_knobs_is_not_resumed_as_another_training(tmp_path):
    """Its finished cells trained with SGD; resumed under today's defaults the rest would train with
    AdamW at SGD's learning rate, in a plan whose cell numbers moved: refused, with what to do."""
    import json

    from bench.cli.run import resumed_config

    old = {k: v for k, v in build_config(toml=None, flags={"device": "cpu"}, gpus=0).flat().items()
           if k != "training"}
    old["lr"] = 0.01
    (tmp_path / "meta.json").write_text(json.dumps({"config": old}))
    with pytest.raises(UserError, match="without the training knobs.*--optimizer sgd"):
        resumed_config(str(tmp_path), 0)
    (tmp_path / "meta.json").write_text(json.dumps({"config": {**old, "training": {"optimizer": ["sgd"]}}}))
    assert resumed_config(str(tmp_path), 0).training.knobs["optimizer"] == ["sgd"]
