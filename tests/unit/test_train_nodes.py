"""Where a training group's launches run (bench.train.nodes): one node, or every node through node
0's coordinator, behind one interface; chosen per group."""

from __future__ import annotations

from types import SimpleNamespace as NS

from bench.train.nodes import REMOTE_POLL_S, ManyNodes, OneNode, nodes_for


class FakeCoord:
    share = 2
    me = {"local_addr": "10.0.0.1"}

    def __init__(self):
        self.polls = 0
        self.seqs: list[int] = []

    def launch(self, plan, *, rdzv_id, nproc_per_node):
        self.seqs.append(len(self.seqs))
        return self.seqs[-1]

    def events(self, seq):
        self.polls += 1
        return [f"event of launch {seq}"]

    def lost(self):
        return {1: "no heartbeat"}

    def finish_launch(self, seq):
        return {1: {"seq": seq}}


CFG = NS(nodes=NS(rdzv_timeout_s=30.0, rdzv_endpoint="10.0.0.1:29400"))


def test_a_group_on_one_node_or_a_run_without_coordinator_runs_here():
    coord = FakeCoord()
    assert isinstance(nodes_for(1, CFG, coord), OneNode)
    assert isinstance(nodes_for(2, CFG, None), OneNode)
    assert isinstance(nodes_for(2, CFG, coord), ManyNodes)
    one = OneNode()
    assert one.start(None, "id", 2) == {} and one.poll(True) is None and one.lost() == {} and one.finish() == {}
    assert one.share == 1 and one.rdzv_wait_s == 0


def test_several_nodes_start_poll_and_finish_through_the_coordinator(monkeypatch):
    coord = FakeCoord()
    nodes = ManyNodes(coord, CFG, 2)
    assert nodes.share == 2 and nodes.rdzv_wait_s == 30.0
    rdzv = nodes.start(None, "run-g0-a1", 2)
    assert rdzv == {"nnodes": 2, "endpoint": "10.0.0.1:29400", "rdzv_id": "run-g0-a1", "rdzv_timeout_s": 30.0,
                    "local_addr": "10.0.0.1"}
    assert nodes.poll(False) == (["event of launch 0"], {1: "no heartbeat"})
    assert nodes.poll(False) is None  # asked again within REMOTE_POLL_S: not yet
    assert nodes.poll(True) is not None  # the launch exited: always
    clock = [0.0]
    monkeypatch.setattr("bench.train.nodes.time.monotonic", lambda: clock[0])
    nodes.start(None, "run-g0-a2", 2)
    clock[0] = 100.0
    assert nodes.poll(False)[0] == ["event of launch 1"]
    clock[0] += REMOTE_POLL_S / 2
    assert nodes.poll(False) is None
    assert nodes.finish() == {1: {"seq": 1}}
