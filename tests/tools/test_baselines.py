"""The plain reference programs (tools/baselines) run under torchrun on gloo/CPU and train the same
model as one process: each family's final loss matches a single-process loop of the same steps.

The programs of one world size run in one launch of ``plain_many`` (each its own process group and
JSON line, as when launched alone); one program is also launched alone, as a user runs it."""

from __future__ import annotations

import functools
import json
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

# (id, world size, module, flags, dims): every family at 2; pipeline and TP also at 4 (gpt-tiny has
# 2 layers and 4 heads, so the 4-stage pipeline gets n_layer=4).
CASES = [
    ("ddp-options", 2, "plain_ddp", ["--bucket-mb", "1", "--grad-as-bucket-view", "--static-graph"], ""),
    ("fsdp", 2, "plain_fsdp", [], ""),
    ("gpipe", 2, "plain_pipeline", ["--schedule", "gpipe", "--micro-batches", "4"], ""),
    ("1f1b", 2, "plain_pipeline", ["--schedule", "1f1b", "--micro-batches", "4"], ""),
    ("1f1b-x4", 4, "plain_pipeline", ["--schedule", "1f1b", "--micro-batches", "4"], "n_layer=4"),
    ("tp", 2, "plain_tp", [], ""),
    ("tp-sp", 2, "plain_tp", ["--sequence-parallel"], ""),
    ("tp-sp-x4", 4, "plain_tp", ["--sequence-parallel"], ""),
]


@functools.cache
def reference_loss(dims: str) -> float:
    """The last step's loss of a one-process fp32 SGD loop over the same global batches."""
    kw = {k: int(v) for k, v in (kv.split("=") for kv in dims.split(",") if kv)}
    wl = resolve("gpt-tiny", **kw)
    model = wl.build(torch.device("cpu"))
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    for s in range(WARMUP + STEPS):
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
        p = torchrun(world, "plain_many", args, timeout=300)
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
    assert row["world_size"] == world and row["backend"] == "gloo" and row["precision"] == "fp32"
    assert len(row["step_times_s"]) == STEPS and min(row["step_times_s"]) > 0
    assert row["step_time_median_s"] > 0 and row["gpu"] == "cpu"
    ref = reference_loss(dims)
    assert abs(row["loss_final"] - ref) <= 1e-4 * abs(ref), (row["loss_final"], ref)


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
