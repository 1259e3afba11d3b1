"""Where a process group's launches run: this node alone (:class:`OneNode`), or every node of the
run through node 0's coordinator (:class:`ManyNodes`, :mod:`bench.multinode.nodes`). A group of
several nodes on a run with a coordinator gets the second (:func:`nodes_for`); the group's code is
the same for both."""

from __future__ import annotations

import time
from typing import Any, Protocol

from bench.core import spec
from bench.core.settings import RunConfig
from bench.multinode.nodes import Coordinator

#: seconds between two reads of the other nodes' events and heartbeats while a launch runs
REMOTE_POLL_S = 0.25


class Nodes(Protocol):
    """The nodes one launch of a group runs on."""

    #: launchers on this machine: each launch's CPU threads are divided among them
    share: int
    #: what the rendezvous may add to a launch's start-up (waiting for the other nodes' agents)
    rdzv_wait_s: float

    def lost(self) -> dict[int, str]:
        """Nodes that stopped answering, with why."""
        ...

    def start(self, plan: spec.GroupPlan, rdzv_id: str, nproc: int) -> dict[str, Any]:
        """Start the launch's part on the other nodes; torchrun's rendezvous arguments for this node's."""
        ...

    def poll(self, exited: bool) -> tuple[list[spec.Event], dict[int, str]] | None:
        """The other nodes' rank events since the last poll and the nodes lost; None when it is not
        time to ask (every REMOTE_POLL_S, and once the launch ``exited``)."""
        ...

    def finish(self) -> dict[int, dict[str, Any]]:
        """The launch ended here: the other nodes' outcomes (exit, crash reason, survivors)."""
        ...


class OneNode:
    """This node alone: nothing to start elsewhere, nobody to lose."""

    share = 1
    rdzv_wait_s = 0.0

    def lost(self) -> dict[int, str]:
        return {}

    def start(self, plan: spec.GroupPlan, rdzv_id: str, nproc: int) -> dict[str, Any]:
        return {}

    def poll(self, exited: bool) -> tuple[list[spec.Event], dict[int, str]] | None:
        return None

    def finish(self) -> dict[int, dict[str, Any]]:
        return {}


class ManyNodes:
    """Every node of the run, through node 0's coordinator; one launch at a time."""

    def __init__(self, coord: Coordinator, cfg: RunConfig, nnodes: int):
        self.coord, self.cfg, self.nnodes = coord, cfg, nnodes
        self.rdzv_wait_s = cfg.nodes.rdzv_timeout_s
        self.seq = -1  # the coordinator's number of the launch running
        self.last = 0.0

    @property
    def share(self) -> int:
        return self.coord.share

    def lost(self) -> dict[int, str]:
        return self.coord.lost()

    def start(self, plan: spec.GroupPlan, rdzv_id: str, nproc: int) -> dict[str, Any]:
        self.seq = self.coord.launch(plan, rdzv_id=rdzv_id, nproc_per_node=nproc)
        self.last = 0.0
        return dict(nnodes=self.nnodes, endpoint=self.cfg.nodes.rdzv_endpoint, rdzv_id=rdzv_id,
                    rdzv_timeout_s=self.cfg.nodes.rdzv_timeout_s, local_addr=self.coord.me["local_addr"])

    def poll(self, exited: bool) -> tuple[list[spec.Event], dict[int, str]] | None:
        if not exited and time.monotonic() - self.last <= REMOTE_POLL_S:
            return None
        self.last = time.monotonic()
        return self.coord.events(self.seq), self.coord.lost()  # the other nodes' ranks' errors

    def finish(self) -> dict[int, dict[str, Any]]:
        return self.coord.finish_launch(self.seq)


def nodes_for(nnodes: int, cfg: RunConfig, coord: Coordinator | None) -> Nodes:
    """A group of ``nnodes`` nodes runs on every node when the run has a coordinator, else here."""
    return ManyNodes(coord, cfg, nnodes) if nnodes > 1 and coord is not None else OneNode()
