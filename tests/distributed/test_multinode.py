"""Two nodes on one machine: two `parbench run --nnodes 2` launchers on localhost, torchrun's c10d
rendezvous between them, gloo across them.

Node 0 writes the tables: the one-device reference runs on it alone; DDP and a pipeline span both
nodes and must match one device, record where each rank ran and that the traffic crossed nodes
(over loopback here), and the other node's telemetry must reach node 0's samples. A mismatched
plan is refused on both nodes with one line; a node that dies stops neither the other node forever
nor leaves a process behind.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time

import pandas as pd
import pytest

from bench.results.run import load_run
from tests.distributed.agents import free_port, leftovers, run_dir, start, wait_all
from tests.procs import saved

pytestmark = pytest.mark.distributed

SMALL = ["--device", "cpu", "--workloads", "gpt-tiny", "--steps", "3", "--warmup", "1", "--profile-steps", "1",
         "--sample-hz", "5", "--cell-timeout", "60", "--rdzv-timeout", "60"]


def two_nodes(tmp_path, args: list[str], *, timeout_s: float = 240.0, args1: list[str] | None = None):
    ep = f"127.0.0.1:{free_port()}"
    out = tmp_path / "out"
    procs = [start(args, node_rank=0, nnodes=2, endpoint=ep, out=out),
             start(args1 if args1 is not None else args, node_rank=1, nnodes=2, endpoint=ep, out=out)]
    return wait_all(procs, timeout_s), out


@pytest.mark.slow  # two local agents; the fast suite has the plan handshake between two nodes
def test_ddp_and_pipeline_across_two_local_agents(tmp_path):
    (n0, n1), out = two_nodes(tmp_path, [*SMALL, "--strategies", "ddp,pipeline-gpipe", "--world-sizes", "2"])
    assert n0.rc == 0, saved("node0", n0.out, n0.err)
    assert n1.rc == 0, saved("node1", n1.out, n1.err)
    assert "node 1: done" in n1.out
    d = run_dir(out)
    cells, _, meta = load_run(d)
    ok = cells[cells["status"] == "ok"]
    assert set(ok["strategy"]) == {"single", "ddp", "pipeline-gpipe"}, cells[["strategy", "status", "reason"]]
    multi = ok[ok["strategy"] != "single"]
    assert (multi["nnodes"] == 2).all() and multi["cross_node"].all()
    assert multi["parity_ok"].all(), multi[["strategy", "parity_rel_err"]]
    assert (multi["link"] == "2 nodes over lo").all(), multi["link"].tolist()
    for text in multi["rank_placement"]:
        placed = json.loads(text)
        assert sorted(p["node"] for p in placed) == [0, 1] and {p["iface"] for p in placed} == {"lo"}, placed
        # the ranks record their CPU threads: 1 here, since tests.distributed.agents starts every
        # agent with OMP_NUM_THREADS=1, which child_env keeps (it only sets a default)
        assert all(p["threads"] == 1 for p in placed), placed
    single = ok[ok["strategy"] == "single"].iloc[0]
    assert single["nnodes"] == 1 and not single["cross_node"] and pd.isna(single["link"])
    assert [n["node"] for n in meta["nodes"]] == [0, 1]
    samples = pd.read_parquet(d / "samples.parquet")
    assert set(samples["node"].dropna().astype(int)) == {0, 1}  # node 1 shipped its telemetry
    assert (d / "work" / "node1").is_dir()  # node 1's own logs (same machine here)
    from reports import build_report

    html = build_report(d).read_text()
    assert "2 nodes over lo" in html and re.search(r"<th[^>]*>link</th>", html)
    assert not leftovers(str(tmp_path))


@pytest.mark.slow
def test_hybrid_placement_keeps_the_chosen_dimension_inside_a_node(tmp_path):
    """FSDP x TP on 4 ranks, 2 a node, laid out with data parallel inside the node: the transposed
    mesh trains the same model, and the row says which dimension crossed nodes."""
    (n0, n1), out = two_nodes(tmp_path, [*SMALL, "--workloads", "gpt-tiny[n_layer=2]", "--strategies", "fsdp-tp",
                                         "--world-sizes", "4", "--option", "placement=dp-in-node"])
    assert n0.rc == 0 and n1.rc == 0, saved("two-nodes", n0.err, n1.err)
    cells, _, _ = load_run(run_dir(out))
    row = cells[cells["strategy"] == "fsdp-tp"].iloc[0]
    assert row["status"] == "ok", row["reason"]
    assert row["option_placement"] == "dp-in-node" and row["mesh_placement"] == "tp across 2 nodes, dp within nodes"
    assert row["parity_ok"], row["parity_rel_err"]
    assert not leftovers(str(tmp_path))


@pytest.mark.long
def test_a_mismatched_plan_is_refused_on_both_nodes(tmp_path):
    (n0, n1), out = two_nodes(tmp_path, [*SMALL, "--strategies", "ddp", "--world-sizes", "2"],
                              args1=[*SMALL, "--strategies", "ddp", "--world-sizes", "2", "--steps", "4"],
                              timeout_s=120)
    for n in (n0, n1):
        err = n.err.strip()
        assert n.rc == 2, (n.rc, saved("mismatch", err))
        assert "Traceback" not in err and len(err.splitlines()) == 1, saved("mismatch", err)
        assert "the nodes planned different matrices" in err and "same flags" in err, err
    assert not [p for p in out.rglob("meta.json")]  # refused before a run folder was opened
    assert not leftovers(str(tmp_path))


def _wait_for(path_glob, base, timeout_s: float) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if list(base.rglob(path_glob)):
            return True
        time.sleep(0.2)
    return False


@pytest.mark.slow
@pytest.mark.parametrize("victim", [1, 0])
def test_a_node_that_dies_stops_neither_the_other_forever_nor_leaves_processes(tmp_path, victim):
    """SIGKILL one node's launcher while a cell spans both: the other ends on its own (node 0 with a
    row for every cell naming the lost node; node 1 with a one-line error), and no process of
    either tree survives."""
    ep = f"127.0.0.1:{free_port()}"
    out = tmp_path / "out"
    args = [*SMALL, "--strategies", "tests.helpers:LinkProbe", "--world-sizes", "2",
            "--steps", "400", "--option", "probe_kib=64", "--option", "pingpongs=1"]
    env = {"PARBENCH_NODE_LOST_S": "5"}
    procs = [start(args, node_rank=r, nnodes=2, endpoint=ep, out=out, env=env) for r in (0, 1)]
    try:
        assert _wait_for("node1/g*-r*.jsonl", out, 120), "the cell spanning both nodes never started"
        time.sleep(2.0)
        os.kill(procs[victim].pid, signal.SIGKILL)
        nodes = wait_all(procs, 120)  # the surviving node must stop on its own: past 120 s it is killed and fails
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    other = nodes[1 - victim]
    assert "[test] killed after" not in other.err, saved("survivor", other.err)
    if victim == 1:
        assert other.rc == 0, saved("survivor", other.err)
        cells, _, _ = load_run(run_dir(out))
        probe = cells[cells["strategy"] == "test-linkprobe"].iloc[0]
        assert probe["status"] in ("failed", "timeout") and "node" in probe["reason"], probe["reason"]
    else:
        err = other.err.strip().splitlines()
        assert other.rc == 1 and "node 0" in err[-1] and "stopped answering" in err[-1], saved("survivor", other.err)
    assert not leftovers(str(tmp_path)), "processes outlived their node"
