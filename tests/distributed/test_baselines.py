"""The plain reference programs (tools/baselines) run under torchrun on gloo/CPU and train the same
model as one process: each family's final loss matches a single-process loop of the same steps."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
import torch

from bench.runtime.process import child_env, free_port, run_tree, torchrun_cmd
from bench.workloads import resolve

pytestmark = pytest.mark.distributed

ROOT = Path(__file__).resolve().parents[2]
STEPS, WARMUP = 3, 1

# (id, world size, module, flags, dims): every family at 2; pipeline and TP also at 4 (gpt-tiny has
# 2 layers and 4 heads, so the 4-stage pipeline gets n_layer=4).
CASES = [
    ("ddp-options", 2, "plain_ddp", ["--bucket-mb", "1", "--grad-as-bucket-view", "--static-graph"], ""),
    ("fsdp", 2, "plain_fsdp", [], ""),
    ("gpipe", 2, "plain_pipeline", ["--schedule", "gpipe", "--micro-batches", "4"], ""),
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


def run_plain(world: int, module: str, flags: list[str], dims: str) -> dict:
    """torchrun the program on gloo/CPU and return its JSON line."""
    cmd = torchrun_cmd(["--device", "cpu", "--backend", "gloo", "--workload", "gpt-tiny", "--steps", str(STEPS),
                        "--warmup", str(WARMUP), *flags, *(["--dims", dims] if dims else [])],
                       world, module=f"tools.baselines.{module}")
    p = run_tree(cmd, cwd=ROOT, env=_env(world), timeout_s=120)
    assert p.returncode == 0, p.stderr[-3000:]
    lines = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == 1, p.stdout  # one line, from rank 0 only
    return lines[0]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_plain_program_matches_one_process(case):
    _, world, module, flags, dims = case
    row = run_plain(world, module, flags, dims)
    assert row["world_size"] == world and row["backend"] == "gloo" and row["precision"] == "fp32"
    assert len(row["step_times_s"]) == STEPS and min(row["step_times_s"]) > 0
    assert row["step_time_median_s"] > 0 and row["gpu"] == "cpu"
    ref = reference_loss(dims)
    assert abs(row["loss_final"] - ref) <= 1e-4 * abs(ref), (row["loss_final"], ref)


def test_titan_split_counts_embedding_and_head_as_one_block_each():
    from tools.baselines.plain_pipeline import split

    assert split(16, 4, "equal") == [4, 4, 4, 4]
    assert split(16, 4, "titan") == [4, 5, 4, 3]  # 18 units: 5, 5, 4, 4, less the embedding and head
    assert split(16, 2, "titan") == [8, 8]
    assert split(6, 4, "titan") == [1, 2, 2, 1]
    with pytest.raises(SystemExit):
        split(6, 4, "equal")


def test_plain_many_runs_programs_in_turn_each_with_its_own_group_and_line():
    """One launch of plain_many = the programs one after another, each its own process group and
    JSON line, the same losses as when launched alone; a failing program is reported, the next runs."""
    from tools.baselines.interleave import by_program

    common = ["--device", "cpu", "--backend", "gloo", "--workload", "gpt-tiny", "--steps", str(STEPS),
              "--warmup", str(WARMUP)]
    programs = [["plain_ddp", *common], ["plain_pipeline", *common, "--schedule", "1f1b", "--micro-batches", "4"],
                ["plain_fsdp", *common, "--no-such-flag"], ["plain_fsdp", *common]]
    cmd = torchrun_cmd(["--ports", ",".join(str(free_port()) for _ in range(4)),
                        *[a for prog in programs for a in ("--program", " ".join(prog))]],
                       2, module="tools.baselines.plain_many")
    p = run_tree(cmd, cwd=ROOT, env=_env(2), timeout_s=180)

    lines = by_program(p.stdout, 4)
    assert p.returncode != 0  # one program failed
    got = [x.get("baseline") or "error" for x in lines]
    assert got == ["plain-ddp", "plain-pipeline-1f1b", "error", "plain-fsdp"], p.stdout + p.stderr[-2000:]
    assert lines[2]["program"] == "plain_fsdp"
    ref = reference_loss("")
    for x in (lines[0], lines[1], lines[3]):
        assert x["world_size"] == 2 and abs(x["loss_final"] - ref) <= 1e-4 * max(1.0, abs(ref)), x


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
