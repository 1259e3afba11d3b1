"""Runs past one machine: the same plan on every node, torchrun's c10d rendezvous between them.

``parbench run --nnodes N --node-rank R --rdzv-endpoint HOST:PORT`` starts one launcher per node.
Node 0's launcher hosts a ``torch.distributed.TCPStore`` at the endpoint for the whole run; it is
both the c10d rendezvous store of every torchrun agent (``--rdzv-backend=c10d``, ``is_host=0``:
agents of every node, node 0's included, are its clients) and the channel between the launchers
(:mod:`bench.multinode.nodes`). Node 0 plans, decides and writes the tables; the other nodes follow
its launch commands, sample their own host and GPUs and ship the samples and their ranks' error
events to it through the store.

Why the store and not files on a shared results folder: the store is already there (torchrun needs
it for the rendezvous), it needs no shared file system (a laptop and a workstation, or two network
namespaces, work as well as a Slurm cluster), its writes are atomic per key, and a node that dies
is seen at once (its heartbeat stops; the store itself dies with node 0's launcher, which every
other node notices at its next request). Shared folders lag (NFS attribute caching), and a
half-written file on one is indistinguishable from a slow writer. The traffic is small: a few
hundred telemetry rows a second per node and a handful of keys per launch.
"""

from __future__ import annotations

import hashlib

from bench.core import spec


class NodeLost(RuntimeError):
    """Another node of the run stopped answering (its launcher died or the network went away)."""


def plan_digest(cells) -> str:
    """A digest of the planned cells (ids, specs, skip reasons) in order: every node must plan the
    same matrix; two nodes whose digests differ were given other flags, versions or machines."""
    h = hashlib.sha256()
    for p in cells:
        h.update(spec.dump(p.spec).encode())
        h.update(f"|{p.reason}\n".encode())
    return h.hexdigest()
