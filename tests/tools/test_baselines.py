"""The plain reference programs (tools/baselines) run under torchrun on gloo/CPU and train the same
model as one process: each family's final loss matches a single-process loop of the same steps,
with the optimizer the program was given (SGD, Adam, AdamW); activation checkpointing leaves the
loss as it was and compilation moves it by rounding only.

The programs of one world size run in one launch of ``plain_many`` (each its own process group and
JSON line, as when launched alone); one program is also launched alone, as a user runs it."""

from __future__ import annotations

import collections
import functools
import json
import math
import subprocess
from pathlib import Path

import pytest
import torch

from bench.runtime.process import child_env, free_port, run_tree, torchrun_cmd
from bench.workloads import resolve
from tests.procs import saved

# The plain reference loops are developer tools: their runs are in the slow set.
pytestmark = [pytest.mark.distributed, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
STEPS, WARMUP = 3, 1
SGD, ADAMW = ["--optimizer", "sgd"], ["--optimizer", "adamw"]

# (id, world size, module, flags, dims): every family at 2; pipeline and TP also at 4 (gpt-tiny has
# 2 layers and 4 heads, so the 4-stage pipeline gets n_layer=4); the training knobs on one device
# (--no-ddp, world size 1), under DDP and under FSDP2. One compiled case (a cold compile costs ~30 s
# on two cores): one device, the cheapest.
CASES = [
    ("ddp-options", 2, "plain_ddp", [*SGD, "--bucket-mb", "1", "--grad-as-bucket-view", "--static-graph"], ""),
    ("fsdp", 2, "plain_fsdp", SGD, ""),
    ("gpipe", 2, "plain_pipeline", ["--schedule", "gpipe", "--micro-batches", "4"], ""),
    ("1f1b", 2, "plain_pipeline", ["--schedule", "1f1b", "--micro-batches", "4"], ""),
    ("1f1b-x4", 4, "plain_pipeline", ["--schedule", "1f1b", "--micro-batches", "4"], "n_layer=4"),
    ("tp", 2, "plain_tp", [], ""),
    ("tp-sp", 2, "plain_tp", ["--sequence-parallel"], ""),
    ("tp-sp-x4", 4, "plain_tp", ["--sequence-parallel"], ""),
    ("single-adamw", 1, "plain_ddp", ["--no-ddp", *ADAMW], ""),
    ("single-adam-ac", 1, "plain_ddp", ["--no-ddp", "--optimizer", "adam", "--ac", "full"], ""),
    ("single-sac", 1, "plain_ddp", ["--no-ddp", *ADAMW, "--ac", "selective"], ""),
    ("single-compile", 1, "plain_ddp", ["--no-ddp", *ADAMW, "--compile"], ""),
    ("ddp-default", 2, "plain_ddp", [], ""),  # adamw, as the harness
    ("ddp-ac", 2, "plain_ddp", [*ADAMW, "--ac", "full"], ""),
    ("ddp-sac", 2, "plain_ddp", [*SGD, "--ac", "selective"], ""),
    ("fsdp-adamw", 2, "plain_fsdp", ADAMW, ""),
    ("fsdp-ac", 2, "plain_fsdp", [*ADAMW, "--ac", "full"], ""),
    ("fsdp-sac", 2, "plain_fsdp", [*ADAMW, "--ac", "selective"], ""),
]


def _flag(flags: list[str], name: str, default: str) -> str:
    return flags[flags.index(name) + 1] if name in flags else default


def knobs_of(module: str, flags: list[str]) -> tuple[str, bool, str]:
    """(optimizer, compile, ac) a case asked for; the programs without the knob flags train with SGD."""
    if module not in ("plain_ddp", "plain_fsdp"):
        return "sgd", False, "none"
    return _flag(flags, "--optimizer", "adamw"), "--compile" in flags, _flag(flags, "--ac", "none")


@functools.cache
def reference_loss(dims: str, optimizer: str = "sgd", steps: int = WARMUP + STEPS) -> float:
    """The last step's loss of a one-process fp32 eager loop over the same global batches, with the
    optimizer and learning rate the plain programs default to (SGD 1e-2, Adam and AdamW 3e-4)."""
    kw = {k: int(v) for k, v in (kv.split("=") for kv in dims.split(",") if kv)}
    wl = resolve("gpt-tiny", **kw)
    model = wl.build(torch.device("cpu"))
    opt = {"sgd": lambda p: torch.optim.SGD(p, lr=1e-2), "adam": lambda p: torch.optim.Adam(p, lr=3e-4),
           "adamw": lambda p: torch.optim.AdamW(p, lr=3e-4)}[optimizer](model.parameters())
    for s in range(steps):
        x, y = wl.batch(s)
        loss = wl.loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return float(loss.detach())


def _env(world: int) -> dict[str, str]:
    """The runtime's rank environment, this checkout importable, one thread a rank (2 cores)."""
    env = child_env(world, path=[str(ROOT)])
    env["OMP_NUM_THREADS"] = "1"
    return env


def _common(dims: str = "") -> list[str]:
    return ["--device", "cpu", "--backend", "gloo", "--workload", "gpt-tiny", "--steps", str(STEPS), "--warmup",
            str(WARMUP), *(["--dims", dims] if dims else [])]


def torchrun(world: int, module: str, args: list[str], timeout: int) -> subprocess.CompletedProcess:
    cmd = torchrun_cmd(args, world, module=f"tools.baselines.{module}")
    return run_tree(cmd, cwd=ROOT, env=_env(world), timeout_s=timeout)


#: A program that fails (an unknown flag) between two that work: reported, and the next one runs.
FAILING = ("plain_fsdp", ["--no-such-flag"], "")


@pytest.fixture(scope="module")
def many() -> dict[int, tuple[list[dict | None], subprocess.CompletedProcess, list[tuple]]]:
    """One launch of plain_many per world size: every case of that size in turn (at 2, with a
    failing program in the middle), each its own process group and JSON line. World size ->
    (each program's line, the launch, the programs in order)."""
    out = {}
    for world in sorted({c[1] for c in CASES}):
        progs = [(m, f, d) for _, w, m, f, d in CASES if w == world]
        if world == 2:
            progs.insert(2, FAILING)
        args = ["--ports", ",".join(str(free_port()) for _ in progs)]
        for m, f, d in progs:
            args += ["--program", " ".join([m, *_common(d), *f])]
        p = torchrun(world, "plain_many", args, timeout=400)
        out[world] = (by_program(p.stdout, len(progs)), p, progs)
    return out


def by_program(stdout: str, n: int) -> list[dict | None]:
    from tools.baselines.interleave import by_program as parse

    return parse(stdout, n)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_plain_program_matches_one_process(many, case):
    name, world, module, flags, dims = case
    lines, p, progs = many[world]
    row = lines[progs.index((module, flags, dims))]
    assert row and "plain_many_error" not in row, saved(f"plain-{name}", p.stdout, p.stderr)
    backend = "none" if "--no-ddp" in flags else "gloo"
    assert row["world_size"] == world and row["backend"] == backend and row["precision"] == "fp32"
    assert len(row["step_times_s"]) == STEPS and min(row["step_times_s"]) > 0
    assert row["step_time_median_s"] > 0 and row["gpu"] == "cpu" and row["peak_mem_bytes"] is None
    optimizer, compiled, ac = knobs_of(module, flags)
    assert (row["optimizer"], row["compile"], row["ac"]) == (optimizer, compiled, ac), row
    assert row["lr"] == (1e-2 if optimizer == "sgd" else 3e-4)
    if module in ("plain_ddp", "plain_fsdp"):
        assert row["ac_blocks"] == (0 if ac == "none" else 2)  # gpt-tiny's two transformer blocks
    # Compilation: the compiling steps and five more run untimed; the first step's seconds recorded.
    assert row["warmup"] == (2 + 5 if compiled else WARMUP) and row["warmup_requested"] == WARMUP
    assert (row["compile_s"] > 0) if compiled else row["compile_s"] is None
    assert math.isfinite(row["loss_final"])
    ref = reference_loss(dims, optimizer, row["warmup"] + STEPS)
    # Checkpointing recomputes the same ops (the same loss); inductor's fp32 kernels match eager's
    # to well inside the bound on this model.
    tol = 1e-4 * abs(ref)
    assert abs(row["loss_final"] - ref) <= tol, (row["loss_final"], ref)
    if optimizer != "sgd":  # the optimizer took effect: SGD's trajectory is 5-6 bounds away (3e-3)
        assert abs(row["loss_final"] - reference_loss(dims, "sgd", row["warmup"] + STEPS)) > 4 * tol


def test_plain_many_reports_a_failing_program_and_runs_the_next(many):
    """The launch's exit code says a program failed; its line names the program; the programs
    after it still ran and each printed one result line, on rank 0 only."""
    lines, p, progs = many[2]
    assert p.returncode != 0, saved("plain-many", p.stdout, p.stderr)
    bad = progs.index(FAILING)
    assert lines[bad] and "plain_many_error" in lines[bad] and lines[bad]["program"] == "plain_fsdp", lines[bad]
    assert all(x and "plain_many_error" not in x for i, x in enumerate(lines) if i != bad), saved(
        "plain-many", p.stdout, p.stderr)
    # between two markers, one result line: rank 0 prints, the other ranks do not
    per: list[int] = []
    for text in p.stdout.splitlines():
        if text.startswith("{"):
            if "plain_many_index" in json.loads(text):
                per.append(0)
            else:
                per[-1] += 1
    assert per == [1] * len(progs), (per, saved("plain-many", p.stdout, p.stderr))


def test_a_plain_program_launched_alone_prints_one_line_from_rank_0():
    """The way a user runs one: its own torchrun, one JSON line on stdout (rank 0 only), the same
    loss as one process."""
    _, world, module, flags, dims = CASES[0]
    p = torchrun(world, module, [*_common(dims), *flags], timeout=120)
    assert p.returncode == 0, saved("plain-alone", p.stdout, p.stderr)
    lines = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == 1, saved("plain-alone", p.stdout, p.stderr)
    ref = reference_loss(dims)
    assert lines[0]["world_size"] == world and abs(lines[0]["loss_final"] - ref) <= 1e-4 * abs(ref)


def test_titan_split_counts_embedding_and_head_as_one_block_each():
    from tools.baselines.plain_pipeline import split

    assert split(16, 4, "equal") == [4, 4, 4, 4]
    assert split(16, 4, "titan") == [4, 5, 4, 3]  # 18 units: 5, 5, 4, 4, less the embedding and head
    assert split(16, 2, "titan") == [8, 8]
    assert split(6, 4, "titan") == [1, 2, 2, 1]
    with pytest.raises(SystemExit):
        split(6, 4, "equal")


def test_selective_checkpointing_recomputes_all_but_matmuls_and_attention():
    """In one process, ops counted over a forward and backward of gpt-tiny: full checkpointing
    runs the blocks' forward again in backward, matrix products included; selective runs the norms
    and activations again but no matrix product (saved by the policy); the blocks become
    checkpoint wrappers in place, the loss unchanged."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from tools.baselines import _common as c

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.n: collections.Counter = collections.Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.n[func.overloadpacket.__name__] += 1
            return func(*args, **(kwargs or {}))

    wl = resolve("gpt-tiny")
    x, y = wl.batch(0)
    counts, losses = {}, {}
    for mode in ("none", "full", "selective"):
        model = wl.build(torch.device("cpu"))
        assert c.apply_ac(model, wl, mode) == (0 if mode == "none" else 2)
        kinds = [type(b).__name__ for b in c.transformer_blocks(wl, model)]
        assert kinds == ["Block" if mode == "none" else "CheckpointWrapper"] * 2, kinds
        with Count() as cnt:
            loss = wl.loss(model(x), y)
            loss.backward()
        counts[mode], losses[mode] = cnt.n, float(loss.detach())
    none, full, sel = counts["none"], counts["full"], counts["selective"]
    # (full recomputes each block's forward only as far as backward needs it: not its last product)
    assert full["mm"] > none["mm"] and sel["mm"] == none["mm"], (none["mm"], full["mm"], sel["mm"])
    for op in ("gelu", "native_layer_norm"):
        assert full[op] > none[op] and sel[op] == full[op], (op, none[op], full[op], sel[op])
    assert losses["full"] == losses["none"] == losses["selective"]


def test_interleave_runs_a_one_device_family_at_world_size_1(tmp_path):
    """The plain side of the single-* families at world size 1, as interleave.py launches it (one
    plain_many launch of the group's programs, the torchrun variables of one rank): each record
    is ok and its line says one device, no process group, the family's knobs."""
    from tools.baselines import interleave as il

    args, fams, worlds = il.parse_args(["--device", "cpu", "--workload", "gpt-tiny", "--world-sizes", "1",
                                        "--families", "single-adamw,single-sac", "--steps", "2", "--warmup", "1",
                                        "--run-timeout-s", "120", "--out", str(tmp_path)])
    assert worlds == [1]
    state = il.State(args={})
    il.run_plain(fams, 1, 0, args, state)
    assert [r["family"] for r in state.runs] == fams and all(r["ok"] for r in state.runs), state.runs
    for r in state.runs:
        assert r["world_size"] == 1 and r["batched_with"] == fams
        row = r["row"]
        assert row["baseline"] == "plain-single" and row["backend"] == "none" and row["optimizer"] == "adamw"
    assert [r["row"]["ac"] for r in state.runs] == ["none", "selective"]


# ---- interleave.py: one real gloo run (its pure logic: tests/unit/test_interleave.py) ----------

@pytest.mark.slow  # ~90 s on 2 cores: two harness calls (torchrun, reference cell) and two plain launches
def test_interleave_global_batch_reaches_both_sides(tmp_path):
    """A real gloo run: --global-batch 4 (gpt-tiny's own is 8, so the flag must have reached each
    side) and --dims; both sides report the batch and the same workload in every round."""
    from tools.baselines.interleave import main

    rc = main(["--device", "cpu", "--workload", "gpt-tiny", "--global-batch", "4", "--dims", "n_layer=2",
               "--families", "ddp", "--world-sizes", "2", "--repeats", "2", "--steps", "3", "--warmup", "1",
               "--run-timeout-s", "120", "--out", str(tmp_path)])
    d = json.loads((tmp_path / "interleave.json").read_text())
    assert rc == 0, d["runs"]
    assert len(d["runs"]) == 4 and all(r["ok"] for r in d["runs"])
    for r in d["runs"]:
        assert r["global_batch"] == 4 and r["row"]["global_batch"] == 4, r
        assert r["row"]["workload"] == "gpt-tiny(global_batch=4,n_layer=2)"
    (row,) = d["table"]
    assert row["n"] == 2 and row["global_batch"] == [4] and row["verdict"] and not row["round_notes"]
