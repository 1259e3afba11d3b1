"""Multi-node pieces without torchrun: the endpoint, the plan on several nodes, placement of the
2D hybrids, the row's placement columns, event files by global rank, and the launchers' store
protocol (handshake, telemetry, errors, a lost node) in one process."""

from __future__ import annotations

import dataclasses
import json
import threading
import time

import psutil
import pytest

from bench.core import spec
from bench.core.config import build_config
from bench.core.errors import UserError
from bench.core.rendezvous import parse_endpoint
from bench.core.spec import RankMeasurement
from bench.multinode import plan_digest
from bench.plan.matrix import group, plan
from bench.results.rows import placement_columns
from bench.runtime.crash import crash_reason, err_ranks
from bench.runtime.events import EventReader
from bench.runtime.process import child_env, torchrun_cmd
from strategies.common import mesh_groups
from tests.procs import saved


def cfg_of(gpus: int = 0, **flags):
    base = {"device": "cpu", "workloads": "gpt-tiny", "strategies": "single,ddp,fsdp-tp,dp-pp", "steps": 2}
    return build_config(toml=None, flags={**base, **flags}, gpus=gpus)


@pytest.mark.parametrize("text, host, port", [("10.0.0.1:29400", "10.0.0.1", 29400), ("node-a:1", "node-a", 1),
                                              ("[fe80::1]:29500", "fe80::1", 29500)])
def test_parse_endpoint(text, host, port):
    assert parse_endpoint(text) == (host, port)


def test_defaults_on_several_nodes_scale_per_node_and_stay_on_loopback():
    cfg = cfg_of(nnodes=2)
    assert cfg.matrix.world_sizes == [1, 2, 4] and cfg.nodes.rdzv_endpoint == "127.0.0.1:29400"
    assert cfg_of().nodes.rdzv_endpoint is None and cfg_of().nodes.nnodes == 1


def test_plan_on_two_nodes_one_process_cells_on_node_0_and_gpus_per_node():
    cfg = cfg_of(gpus=2, device="cuda", backends="nccl", nnodes=2, world_sizes="2,4,8",
                 strategies="single,ddp,dataparallel")
    cells, _, _ = plan(cfg, gpus=2)
    by = {(p.spec.strategy, p.spec.n_devices): p for p in cells}
    assert by[("single", 1)].spec.nnodes == 1 and by[("single", 1)].spec.devices == (0,)
    ddp4 = by[("ddp", 4)].spec
    assert ddp4.nnodes == 2 and ddp4.devices == (0, 1) and ddp4.procs_per_node == 2
    assert by[("ddp", 4)].reason is None
    assert "needs 4 GPUs a node; 2 visible here" in by[("ddp", 8)].reason
    assert by[("dataparallel", 2)].spec.nnodes == 1  # one process: node 0 alone
    groups = group(cells)
    assert [g.label for g in groups][:2] == ["nccl x1", "nccl x2 on 2 nodes"]


def test_the_plan_digest_is_the_same_for_the_same_flags_and_differs_otherwise():
    a, _, _ = plan(cfg_of(nnodes=2), gpus=0)
    b, _, _ = plan(cfg_of(nnodes=2, node_rank=1), gpus=0)
    c, _, _ = plan(cfg_of(nnodes=2, steps=3), gpus=0)
    assert plan_digest(a) == plan_digest(b) != plan_digest(c)


def test_mesh_groups_and_placement_on_two_nodes():
    dps, mps = mesh_groups(2, 2, "mp-in-node")
    assert mps == [[0, 1], [2, 3]] and dps == [[0, 2], [1, 3]]
    dps, mps = mesh_groups(2, 2, "dp-in-node")
    assert mps == [[0, 2], [1, 3]] and dps == [[0, 1], [2, 3]]
    cells, _, _ = plan(cfg_of(nnodes=2, world_sizes="4", strategies="fsdp-tp,dp-pp",
                                     workloads="gpt-tiny[n_layer=6]"), gpus=0)
    fsdp_tp = next(p for p in cells if p.spec.strategy == "fsdp-tp")
    assert fsdp_tp.reason is None and fsdp_tp.spec.labels["mesh_placement"] == "tp within nodes, dp across 2 nodes"
    cells, _, _ = plan(cfg_of(nnodes=2, world_sizes="8", strategies="fsdp-tp,dp-pp",
                                     workloads="gpt-tiny[n_layer=6,n_head=4]", options={"mesh": "2x4"}), gpus=0)
    for p in cells:
        if p.spec.strategy in ("fsdp-tp", "dp-pp"):
            assert p.reason is None or "placement" not in p.reason, p.reason  # tp=4 fits a node of 4
    cells, _, _ = plan(cfg_of(nnodes=4, world_sizes="8", strategies="fsdp-tp",
                                     workloads="gpt-tiny[n_layer=6,n_head=4]", options={"mesh": "2x4"}), gpus=0)
    tp = next(p for p in cells if p.spec.strategy == "fsdp-tp")
    assert "placement mp-in-node: tp=4 ranks cannot share a node of 2 ranks" in tp.reason
    assert "placement=dp-in-node" in tp.reason


def test_placement_columns_say_which_nodes_and_link():
    ranks = [RankMeasurement(rank=r, node_rank=r // 2, host="h", addr=f"10.0.0.{1 + r // 2}", iface=f"veth{r // 2}",
                             local_rank=r % 2) for r in range(4)]
    cols = placement_columns(ranks)
    assert cols["cross_node"] and cols["link"] == "2 nodes over veth0/veth1"
    assert cols["hosts"] == "h(10.0.0.1),h(10.0.0.2)"
    assert [p["node"] for p in json.loads(cols["rank_placement"])] == [0, 0, 1, 1]
    nccl = placement_columns(ranks, backend="nccl")["link"]  # two agents on one host: NCCL uses NVLink/P2P/shm
    assert nccl.startswith("2 nodes over veth0/veth1; one host") and "intra-host" in nccl
    apart = [dataclasses.replace(r, host=f"h{r.node_rank}") for r in ranks]
    assert placement_columns(apart, backend="nccl")["link"] == "2 nodes over veth0/veth1"
    one = placement_columns([RankMeasurement(rank=0, host="h", iface="lo")])
    assert not one["cross_node"] and one["link"] is None


def test_events_and_errors_are_read_by_global_rank(tmp_path):
    prefix = str(tmp_path / "g1-a1")
    for r in (2, 3):  # node 1 of a 2 x 2 run holds global ranks 2 and 3
        event = spec.Error(cell_id=4, rank=r, reason="boom", t=1.0)
        (tmp_path / f"g1-a1-r{r}.jsonl").write_text(spec.dump(event) + "\n")
        (tmp_path / f"g1-a1-r{r}.err").write_text(f"RuntimeError: rank {r} broke\n")
    assert sorted(e.rank for e in EventReader(prefix).poll()) == [2, 3]
    assert err_ranks(prefix) == [2, 3]
    assert "rank 2: RuntimeError: rank 2 broke" in crash_reason(prefix, tmp_path / "none.log", 1)


def test_ranks_of_nodes_sharing_a_machine_share_its_cores(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    import bench.measure.hardware

    monkeypatch.setattr(bench.measure.hardware, "cpu_threads", lambda: 8)  # threads_per_rank's source of CPUs
    assert child_env(2)["OMP_NUM_THREADS"] == "4"
    env = child_env(2, node_rank=1, share=2)
    assert env["OMP_NUM_THREADS"] == "2" and env["PARBENCH_NODE_RANK"] == "1"


def test_every_world_size_gets_the_threads_of_a_rank_of_the_widest(monkeypatch):
    """On a CPU a one-rank cell with every core measured another machine than its two-rank
    neighbour: each rank gets the share of a rank of the run's widest launch."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    import bench.measure.hardware

    monkeypatch.setattr(bench.measure.hardware, "cpu_threads", lambda: 8)
    assert [child_env(n, widest=4)["OMP_NUM_THREADS"] for n in (1, 2, 4)] == ["2", "2", "2"]
    assert child_env(1)["OMP_NUM_THREADS"] == "8"  # no widest given: the launch's own share


def test_torchrun_command_uses_c10d_at_the_endpoint_on_several_nodes():
    cmd = torchrun_cmd("p.json", 2, module="bench.train.worker", nnodes=2, endpoint="10.0.0.1:29400",
                       rdzv_id="r-g1-a1", rdzv_timeout_s=60)
    assert cmd[-3:] == ["-m", "bench.train.worker", "p.json"]
    assert "--rdzv-backend=c10d" in cmd and "--rdzv-endpoint=10.0.0.1:29400" in cmd
    assert "--rdzv-conf=is_host=0,join_timeout=60" in cmd and "--nnodes=2" in cmd and "--nproc-per-node=2" in cmd
    assert "--master-addr=127.0.0.1" in torchrun_cmd("p.json", 2, module="bench.train.worker")


def _pair(tmp_path, digest1: str = "same"):
    """A coordinator and a follower of a 2-node run in this process (threads), on a free port. The
    heartbeat's default loss time stands: a shorter one (a beat a second) calls the follower lost
    on a loaded machine."""
    from bench.multinode import nodes
    from tests.distributed.agents import free_port

    cfg0 = cfg_of(nnodes=2, rdzv_endpoint=f"127.0.0.1:{free_port()}", rdzv_timeout_s=20, out=str(tmp_path))
    cfg1 = build_config(toml=None, flags={**{k: v for k, v in cfg0.to_dict().items() if k != "options"},
                                          "node_rank": 1}, gpus=0)
    coord = nodes.Coordinator(cfg0, "same", 3)
    got: dict = {}

    def join():
        try:
            got["follower"] = nodes.Follower(cfg1, digest1, 3)
        except Exception as e:  # noqa: BLE001
            got["error"] = e

    t = threading.Thread(target=join)
    t.start()
    return nodes, coord, got, t


def test_store_protocol_handshake_telemetry_errors_and_a_lost_node(tmp_path):
    nodes, coord, got, t = _pair(tmp_path)
    coord.wait_joined()
    coord.accept(tmp_path / "run-x")
    t.join(10)
    f = got["follower"]
    assert f.run_id == "run-x" and f.share == 2 and coord.share == 2  # both "nodes" on this machine
    f.push_samples([{"host": "h", "device": "host", "t": 1.0, "metric": "load1", "value": 0.5}])
    rows = coord.samples()
    assert rows == [{"host": "h", "device": "host", "t": 1.0, "metric": "load1", "value": 0.5, "node": 1}]
    assert coord.samples() == []
    f.push_event(0, spec.dump(spec.Error(cell_id=1, rank=1, reason="boom", t=1.0)))
    assert [e.reason for e in coord.events(0)] == ["boom"] and coord.events(0) == []
    assert coord.lost() == {}
    f.bye("stopped: KeyboardInterrupt")
    assert coord.lost() == {1: "stopped: KeyboardInterrupt"}
    coord.close()


def test_store_protocol_refuses_another_plan_on_both_sides(tmp_path):
    nodes, coord, got, t = _pair(tmp_path, digest1="other")
    with pytest.raises(UserError, match="the nodes planned different matrices: node 1 planned 3 cells"):
        coord.wait_joined()
    t.join(10)
    assert isinstance(got["error"], UserError) and "different matrices" in str(got["error"])


@pytest.mark.timeout(120)  # a follower that never gives up fails here, not at the suite's timeout
def test_a_follower_without_node_0_gives_up_with_one_line(tmp_path):
    from bench.multinode.nodes import Follower
    from tests.distributed.agents import free_port

    cfg = cfg_of(nnodes=2, node_rank=1, rdzv_endpoint=f"127.0.0.1:{free_port()}", rdzv_timeout_s=1)
    with pytest.raises(UserError, match=r"node 0 at --rdzv-endpoint 127.0.0.1:\d+ did not answer within 1s"):
        Follower(cfg, "d", 1)


@pytest.mark.timeout(120)  # a handshake that never gives up fails here
def test_a_listener_that_never_answers_is_given_up_after_the_rendezvous_timeout():
    """A service on the endpoint that accepts and stays silent (an HTTP server, say) is given up
    after --rdzv-timeout with one line; torch's store handshake alone would wait forever, deaf to signals."""
    import socket
    import threading

    from bench.core.errors import UserError
    from bench.multinode.nodes import _client

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    held = []
    threading.Thread(target=lambda: held.append(srv.accept()), daemon=True).start()
    try:
        # store operations may take 5 s, the connection 1 s: the handshake is given up on the latter.
        # The abandoned handshake's thread then ends within those 5 s (a thread of torch's still in
        # its store when the test process exits aborts it: "terminate called without an active exception").
        with pytest.raises(UserError, match="did not answer as node 0's store within 1 s"):
            _client("127.0.0.1", srv.getsockname()[1], 5.0, connect_s=1.0)
    finally:
        srv.close()
        for conn, _ in held:
            conn.close()


@pytest.mark.slow  # waits out torch's store retries
def test_a_listener_that_answers_garbage_gives_one_line_not_torchs_retry_stacks(tmp_path):
    """Against a service that answers something else (an SSH banner here) the error is one line:
    none of the C++ stacks torch's store client prints per retry reaches the terminal."""
    import socket
    import subprocess
    import sys
    import threading

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            try:
                c, _ = srv.accept()
                c.sendall(b"SSH-2.0-OpenSSH_8.9\r\n" * 4)
                c.close()
            except OSError:
                return

    threading.Thread(target=serve, daemon=True).start()
    try:
        r = subprocess.run([sys.executable, "-m", "bench", "run", "--device", "cpu", "--workloads", "mlp",
                            "--strategies", "ddp", "--world-sizes", "2", "--nnodes", "2", "--node-rank", "1",
                            "--rdzv-endpoint", f"127.0.0.1:{srv.getsockname()[1]}", "--rdzv-timeout", "2",
                            "--out", str(tmp_path), "--no-progress"], capture_output=True, text=True, timeout=120)
    finally:
        stop.set()
        srv.close()
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2 and len(lines) == 1, saved("garbage-endpoint", r.stderr)
    assert lines[0].startswith("parbench: error: 127.0.0.1:") and "--rdzv-endpoint" in lines[0]


def _listening(procs) -> set[tuple[str, int]]:
    """(address, port) of every TCP socket listening in ``procs`` and their children."""
    found = set()
    for p in procs:
        try:
            tree = [psutil.Process(p.pid), *psutil.Process(p.pid).children(recursive=True)]
        except psutil.Error:
            continue
        for q in tree:
            try:
                found |= {(c.laddr.ip, c.laddr.port) for c in q.net_connections("inet")
                          if c.status == psutil.CONN_LISTEN}
            except psutil.Error:
                continue
    return found


def test_a_bound_store_listens_on_its_host_only_and_owns_its_socket():
    from datetime import timedelta

    from torch.distributed import TCPStore

    from bench.multinode.binding import bound_store

    server = bound_store("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    port = server.port
    assert port > 0 and {ip for ip, p in _listening([psutil.Process()]) if p == port} == {"127.0.0.1"}
    TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=10)).set("k", "v")
    assert server.get("k") == b"v"
    del server  # the store closes the socket it was given
    assert not any(p == port for _, p in _listening([psutil.Process()]))


@pytest.mark.slow  # three torchrun agents: about 35 s on 2 busy cores
def test_the_torchrun_wrapper_binds_torchruns_own_stores(tmp_path):
    """A one-node torchrun (static rendezvous at --master-addr) and two c10d agents (the rank-0 agent
    shares a store with its workers at --local-addr) listen on loopback only."""
    import subprocess
    import sys

    from bench.multinode.binding import bound_store
    from tests.distributed.agents import free_port

    run = [sys.executable, "-m", "bench.multinode.torchrun", "--nproc-per-node=1", "--max-restarts=0"]
    rdzv = bound_store("127.0.0.1", 0, is_master=True, wait_for_workers=False)  # as node 0's launcher hosts it
    c10d = [*run, "--nnodes=2", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{rdzv.port}", "--rdzv-id=t",
            "--rdzv-conf=is_host=0,join_timeout=60", "--local-addr=127.0.0.1", "--no-python", "sleep", "3"]
    static = [*run, "--nnodes=1", "--master-addr=127.0.0.1", f"--master-port={free_port()}", "--no-python", "sleep",
              "3"]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for cmd in (static, c10d, c10d)]
    seen: set[tuple[str, int]] = set()
    end = time.monotonic() + 120
    while any(p.poll() is None for p in procs) and time.monotonic() < end:
        seen |= _listening(procs)
        time.sleep(0.05)
    outs = [p.communicate(timeout=30)[0] if p.poll() is not None else p.kill() for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], outs
    assert len(seen) >= 2 and {ip for ip, _ in seen} == {"127.0.0.1"}, seen
