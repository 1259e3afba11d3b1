"""The launchers of a multi-node run talking through the rendezvous store (see the package doc).

Keys, under the prefix ``parbench/`` of node 0's TCPStore (torchrun's own keys live elsewhere):

==========================  =====================================================================
``hello``                   node 0's plan digest, node count and cell count (set first)
``claim/R``                 counter: a second launcher claiming node rank R is refused
``join/R``                  node R's plan digest, host and address
``verdict``                 node 0's answer: the run id, or why the run cannot start
``beat/R``                  counter each launcher bumps every second (its heartbeat)
``bye/R``                   a launcher that stops says why
``cmd/S``                   node 0's S-th command: ``launch`` (a group plan) or ``end``
``stop/S``                  node 0 ended launch S: a node still running its part kills it
``done/S/R``                node R's part of launch S exited: exit code, crash reason, survivors
``ev/S/R/K``, ``ev/S/R/n``  the K-th error event of node R's ranks in launch S, and the count
``smp/R/K``, ``smp/R/n``    the K-th batch of node R's telemetry rows, and the count
==========================  =====================================================================

A node is lost when its heartbeat has not moved for ``LOST_S`` seconds (measured on the
observer's own clock, so clock skew between machines does not matter), when it said ``bye``, or,
for node 0, when its store stops answering.
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import sys
import tempfile
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from bench import __version__
from bench.core import backends, spec
from bench.core.errors import UserError
from bench.core.rendezvous import parse_endpoint
from bench.multinode import NodeLost
from bench.multinode.binding import refuse_wildcard, serve
from bench.multinode.netinfo import configured_iface, iface_addr, route

log = logging.getLogger("parbench")
HEARTBEAT_S = 1.0
LOST_S = float(os.environ.get("PARBENCH_NODE_LOST_S", "30"))  # a heartbeat this old: the node is gone
PUSH_S = 0.25  # how often a follower ships telemetry
DONE_GRACE_S = 30.0  # how long node 0 waits for the other nodes to report a launch's end


def _wait_port(host: str, port: int, timeout_s: float) -> bool:
    """True once something accepts TCP connections at host:port (polled with plain sockets, so
    that waiting for a node 0 that is not up yet prints nothing)."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        try:
            with socket.create_connection((host, port), timeout=min(2.0, max(end - time.monotonic(), 0.1))):
                return True
        except OSError:
            time.sleep(0.2)
    return False


class _C10dRetriesHidden:
    """Keep torch's C++ client retry warnings off the terminal while connecting: against a listener
    that is not a store each retry prints a C++ stack of about 20 lines, some 200 lines in all
    before the one-line error. The process's stderr (file descriptor 2) goes to
    a temporary file meanwhile; lines that are not c10d's retry chatter are written back after.
    ``abandon()`` (a connection given up while torch's thread still retries): file descriptor 2 stays
    away from the terminal for the rest of the process, and Python's ``sys.stderr`` is reopened on
    the terminal, so the one-line error still shows and the thread's later retries do not (child
    processes started after that have no stderr: the caller is about to exit with the error)."""

    def __enter__(self) -> _C10dRetriesHidden:
        self.saved: int | None = None
        self.abandoned = False
        try:
            if sys.stderr is not None:
                sys.stderr.flush()
            self.saved = os.dup(2)
            self.tmp = tempfile.TemporaryFile()
        except (OSError, ValueError):
            if self.saved is not None:
                os.close(self.saved)
                self.saved = None
            return self
        os.dup2(self.tmp.fileno(), 2)
        return self

    def abandon(self) -> None:
        self.abandoned = True

    def __exit__(self, *exc: Any) -> None:
        if self.saved is None:
            return
        if self.abandoned:
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, 2)
            os.close(null)
            old = sys.stderr
            sys.stderr = open(self.saved, "w", buffering=1, closefd=True)  # noqa: SIM115 - the process's stderr
            for h in logging.getLogger().handlers:  # handlers made before (basicConfig) follow it
                if isinstance(h, logging.StreamHandler) and h.stream is old:
                    h.setStream(sys.stderr)
        else:
            os.dup2(self.saved, 2)
            os.close(self.saved)
        self.tmp.seek(0)
        text = self.tmp.read().decode(errors="replace")
        self.tmp.close()
        keep = [ln for ln in text.splitlines() if ln.strip() and not _C10D_CHATTER.search(ln)]
        if keep:
            sys.stderr.write("\n".join(keep) + "\n")


#: c10d's client retry warnings and the C++ stack frames printed under them
_C10D_CHATTER = re.compile(r"TCPStore\.cpp|socket\.cpp|^frame #\d+:|^Exception raised from |^<omitting python frames>$")


def _client(host: str, port: int, timeout_s: float, connect_s: float | None = None):
    """A client of node 0's store (``timeout_s``: each store operation's). Built on a thread of its
    own and given up after ``connect_s`` (default ``timeout_s``) plus a grace: a listener that
    accepts the connection but never answers (not a parbench node 0, e.g. an HTTP server on that
    port) would hold torch's handshake read forever, past --rdzv-timeout and deaf to SIGINT and
    SIGTERM."""
    from torch.distributed import PrefixStore, TCPStore

    box: dict[str, Any] = {}

    def connect() -> None:
        try:
            box["store"] = TCPStore(host, port, is_master=False, timeout=timedelta(seconds=timeout_s))
        except BaseException as e:  # noqa: BLE001 - raised below, on the caller's thread
            box["error"] = e

    t = threading.Thread(target=connect, name="parbench-store-connect", daemon=True)
    wait = timeout_s if connect_s is None else connect_s
    with _C10dRetriesHidden() as quiet:
        t.start()
        t.join(wait + 5.0)
        alive = t.is_alive()  # decided once: the thread may end between two looks
        if alive:
            quiet.abandon()
    if alive:
        raise UserError(f"{host}:{port} accepted the connection but did not answer as node 0's store within "
                        f"{wait:g} s; check --rdzv-endpoint (is it node 0's parbench run, not another service?)")
    if "error" in box:
        raise box["error"]
    return PrefixStore("parbench", box["store"])


class _Heartbeat(threading.Thread):
    """Bumps ``beat/R`` every HEARTBEAT_S on a connection of its own."""

    def __init__(self, host: str, port: int, rank: int):
        super().__init__(name="parbench-heartbeat", daemon=True)
        self.store = _client(host, port, 30.0)
        self.rank = rank
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            try:
                self.store.add(f"beat/{self.rank}", 1)
            except Exception:  # noqa: BLE001 - a hiccup must not stop the beat (node 0 would call this
                pass  # node lost); a store that is gone for good, the main loop notices on its own
            self.halt.wait(HEARTBEAT_S)


class _Watch:
    """When each node's heartbeat last moved, on this machine's monotonic clock."""

    def __init__(self, ranks: list[int]):
        now = time.monotonic()
        self.last = {r: (-1, now) for r in ranks}

    def stale(self, store, lost_s: float = LOST_S) -> dict[int, str]:
        out = {}
        now = time.monotonic()
        for r, (value, seen) in self.last.items():
            if store.check([f"bye/{r}"]):
                out[r] = store.get(f"bye/{r}").decode()
                continue
            v = store.add(f"beat/{r}", 0)
            if v != value:
                self.last[r] = (v, now)
            elif now - seen > lost_s:
                out[r] = f"no heartbeat for {now - seen:.0f} s"
        return out


def _hello(cfg, digest: str, n_cells: int) -> dict[str, Any]:

    host, port = _host_port(cfg.nodes.rdzv_endpoint)
    addr, iface = route(host, port)
    return {"digest": digest, "nnodes": cfg.nodes.nnodes, "cells": n_cells, "version": __version__,
            "host": socket.gethostname(), "addr": addr, "iface": iface, "local_addr": local_addr(cfg, host, addr)}


def local_addr(cfg, endpoint_host: str, routed: str) -> str:
    """The address this node's torchrun agent gives the others (``--local-addr``): the agent that
    c10d makes rank 0 hosts the workers' store there. Node 0: the endpoint itself (every node
    reaches it by definition; its own route to it may be a loopback alias such as 127.0.1.1).
    Another node: the address of the interface named in GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME,
    else the one its route to node 0 leaves from."""
    if cfg.nodes.node_rank == 0:
        return endpoint_host

    for backend in backends.names():
        name = configured_iface(backend)
        if name and iface_addr(name):
            return iface_addr(name)
    return routed or endpoint_host


def _host_port(endpoint: str) -> tuple[str, int]:
    """(host, port) of ``endpoint``, which every node connects to and node 0 listens on."""
    host, port = parse_endpoint(endpoint)
    refuse_wildcard(endpoint, host, port)
    return host, port


class Coordinator:
    """Node 0: hosts the store, checks that every node planned the same matrix, sends launch
    commands, collects the other nodes' error events, telemetry and launch outcomes."""

    def __init__(self, cfg, digest: str, n_cells: int):
        from torch.distributed import PrefixStore

        self.cfg = cfg
        self.host, self.port = _host_port(cfg.nodes.rdzv_endpoint)
        self.others = list(range(1, cfg.nodes.nnodes))
        self._server = serve(cfg.nodes.rdzv_endpoint, self.host, self.port)
        self.store = PrefixStore("parbench", self._server)
        self.me = _hello(cfg, digest, n_cells)
        self.store.set("hello", json.dumps(self.me))
        self.nodes: dict[int, dict[str, Any]] = {0: self.me}
        self.seq = 0
        self._ev_seen: dict[tuple[int, int], int] = {}
        self._smp_seen = {r: 0 for r in self.others}
        self._lost: dict[int, str] = {}
        self._watch = _Watch(self.others)
        self._beat = _Heartbeat(self.host, self.port, 0)
        self._beat.start()

    def wait_joined(self) -> None:
        """Every other node joined with the same plan, within the rendezvous timeout; else a
        one-line UserError (and the same verdict for the nodes that did join)."""
        end = time.monotonic() + self.cfg.nodes.rdzv_timeout_s
        missing = list(self.others)
        while missing and time.monotonic() < end:
            for r in list(missing):
                if self.store.check([f"join/{r}"]):
                    info = json.loads(self.store.get(f"join/{r}"))
                    self.nodes[r] = info
                    missing.remove(r)
                    if info["digest"] != self.me["digest"]:
                        self.refuse(mismatch(r, info, self.me))
            time.sleep(0.1)
        if missing:
            self.refuse(f"node(s) {', '.join(map(str, missing))} did not join the rendezvous at "
                        f"{self.cfg.nodes.rdzv_endpoint} within {self.cfg.nodes.rdzv_timeout_s:g}s; start parbench run "
                        "with the same flags and their --node-rank there (or raise --rdzv-timeout)")

    def refuse(self, reason: str) -> None:
        self.store.set("verdict", json.dumps({"ok": False, "reason": reason}))
        time.sleep(0.5)  # let the nodes read it before the store goes away with this process
        self.close()
        raise UserError(reason)

    @property
    def share(self) -> int:
        """Nodes on this machine (same host name; two agents on one host, or network namespaces,
        share its cores): each launch's threads are divided among them."""
        return sum(n.get("host") == self.me["host"] for n in self.nodes.values())

    def accept(self, run_dir: Path) -> None:
        hosts = {str(r): n.get("host") for r, n in self.nodes.items()}
        self.store.set("verdict", json.dumps({"ok": True, "run_id": run_dir.name, "run_dir": str(run_dir),
                                              "hosts": hosts}))

    def launch(self, plan: spec.GroupPlan, *, rdzv_id: str, nproc_per_node: int) -> int:
        """Tell the other nodes to start their part of a group; returns the launch's number."""
        seq = self.seq
        self.seq += 1
        self.store.set(f"cmd/{seq}", json.dumps({"kind": "launch", "rdzv_id": rdzv_id, "nproc": nproc_per_node,
                                                 "plan": json.loads(spec.dump(plan))}))
        return seq

    def events(self, seq: int) -> list[spec.Event]:
        """New error events of the other nodes' ranks in launch ``seq``."""
        out = []
        for r in self.others:
            n = self.store.add(f"ev/{seq}/{r}/n", 0)
            k = self._ev_seen.get((seq, r), 0)
            while k < n:
                out.append(spec.load_event(self.store.get(f"ev/{seq}/{r}/{k}").decode()))
                k += 1
            self._ev_seen[(seq, r)] = k
        return out

    def samples(self) -> list[dict[str, Any]]:
        """Telemetry rows the other nodes shipped since the last call (each with its ``node``)."""
        rows: list[dict[str, Any]] = []
        for r in self.others:
            try:
                n = self.store.add(f"smp/{r}/n", 0)
                while self._smp_seen[r] < n:
                    key = f"smp/{r}/{self._smp_seen[r]}"
                    rows.extend(json.loads(self.store.get(key)))
                    self.store.delete_key(key)
                    self._smp_seen[r] += 1
            except Exception as e:  # noqa: BLE001 - telemetry is extra: never stop a run for it
                log.warning("telemetry of node %s not collected: %s", r, e)
        return rows

    def lost(self) -> dict[int, str]:
        """Nodes that stopped answering, with why (they stay lost for the rest of the run)."""
        for r, why in self._watch.stale(self.store).items():
            self._lost.setdefault(r, why)
        return dict(self._lost)

    def finish_launch(self, seq: int) -> dict[int, dict[str, Any]]:
        """Launch ``seq`` ended here: the other nodes stop their part if it still runs; their
        outcomes (exit code, crash reason, survivors), waited for at most DONE_GRACE_S."""
        self.store.set(f"stop/{seq}", "1")
        out: dict[int, dict[str, Any]] = {}
        end = time.monotonic() + DONE_GRACE_S
        while time.monotonic() < end:
            for r in self.others:
                if r not in out and self.store.check([f"done/{seq}/{r}"]):
                    out[r] = json.loads(self.store.get(f"done/{seq}/{r}"))
            if len(out) + len(set(self.lost()) - set(out)) >= len(self.others):
                break
            time.sleep(0.1)
        return out

    def close(self, status: str = "complete") -> None:
        """Tell the other nodes the run is over (they exit), then stop the heartbeat."""
        try:
            self.store.set(f"cmd/{self.seq}", json.dumps({"kind": "end", "status": status}))
            self.seq += 1
            end = time.monotonic() + 5.0
            # Give the others a moment to read it: the store goes away with this process (a node that
            # never joined has nothing to read).
            while time.monotonic() < end and not all(self.store.check([f"bye/{r}"]) for r in self.others
                                                     if r not in self._lost and r in self.nodes):
                time.sleep(0.1)
        except Exception as e:  # noqa: BLE001
            log.warning("could not tell the other nodes that the run ended: %s", e)
        self._beat.halt.set()


def mismatch(r: int, theirs: dict[str, Any], mine: dict[str, Any]) -> str:
    """Why node ``r``'s plan is not node 0's, in one line."""
    if theirs.get("nnodes") != mine.get("nnodes"):
        what = f"--nnodes {theirs.get('nnodes')} on node {r} but {mine.get('nnodes')} on node 0"
    elif theirs.get("version") != mine.get("version"):
        what = f"parbench {theirs.get('version')} on node {r} but {mine.get('version')} on node 0"
    else:
        what = (f"node {r} planned {theirs.get('cells')} cells (digest {str(theirs.get('digest'))[:10]}), node 0 "
                f"{mine.get('cells')} (digest {str(mine.get('digest'))[:10]})")
    return (f"the nodes planned different matrices: {what}; run the same parbench version with the same flags, "
            "config and visible devices on every node")


class Follower:
    """Node R > 0: joins node 0's store, checks the plan, then runs the launches node 0 sends."""

    def __init__(self, cfg, digest: str, n_cells: int):
        self.cfg, self.rank = cfg, cfg.nodes.node_rank
        host, port = _host_port(cfg.nodes.rdzv_endpoint)
        if not _wait_port(host, port, cfg.nodes.rdzv_timeout_s):
            raise UserError(f"node 0 at --rdzv-endpoint {cfg.nodes.rdzv_endpoint} did not answer within "
                            f"{cfg.nodes.rdzv_timeout_s:g}s; start parbench run --node-rank 0 there, or check the "
                            "endpoint")
        try:
            self._handshake(cfg, host, port, digest, n_cells)
        except UserError:
            raise
        except Exception as e:  # noqa: BLE001 - the store's errors (DistError, timeouts): one line
            raise UserError(f"--rdzv-endpoint {cfg.nodes.rdzv_endpoint}: the handshake with node 0 failed "
                            f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); check that "
                            "node 0 runs the same parbench command there") from None
        self._watch = _Watch([0])
        self._beat = _Heartbeat(host, port, self.rank)
        self._beat.start()
        verdict = json.loads(self._wait_key("verdict"))
        if not verdict["ok"]:
            self._refuse(verdict["reason"])
        self.run_id = verdict["run_id"]
        self.share = max(1, sum(h == self.me["host"] for h in verdict.get("hosts", {}).values()))
        self._smp = 0

    def _handshake(self, cfg, host: str, port: int, digest: str, n_cells: int) -> None:
        """Claim this node's rank, wait (at most --rdzv-timeout) for node 0's hello, send ours,
        and refuse a plan that is not node 0's."""
        self.store = _client(host, port, 60.0, connect_s=cfg.nodes.rdzv_timeout_s)
        if self.store.add(f"claim/{self.rank}", 1) > 1:
            raise UserError(f"another node already joined as --node-rank {self.rank}; give each node its own rank "
                            f"from 1 to {cfg.nodes.nnodes - 1} (node 0 hosts the rendezvous)")
        deadline = time.monotonic() + cfg.nodes.rdzv_timeout_s
        while not self.store.check(["hello"]):
            if time.monotonic() > deadline:
                raise UserError(f"--rdzv-endpoint {cfg.nodes.rdzv_endpoint} answers but no parbench node 0 said hello "
                                f"within {cfg.nodes.rdzv_timeout_s:g}s; is it another job's port?")
            time.sleep(0.1)
        self.node0 = json.loads(self.store.get("hello"))
        self.me = _hello(cfg, digest, n_cells)
        self.store.set(f"join/{self.rank}", json.dumps(self.me))
        if self.me["digest"] != self.node0["digest"]:
            self._refuse(mismatch(self.rank, self.me, self.node0))

    def _refuse(self, reason: str) -> None:
        """Say goodbye (node 0 need not wait for this node) and stop with ``reason``."""
        self.store.set(f"bye/{self.rank}", reason)
        if getattr(self, "_beat", None) is not None:
            self._beat.halt.set()
        raise UserError(reason)

    def _check_node0(self) -> None:
        try:
            stale = self._watch.stale(self.store)
        except Exception as e:  # noqa: BLE001 - its store went away with it
            raise NodeLost(f"node 0 at {self.cfg.nodes.rdzv_endpoint} stopped answering ({type(e).__name__}); "
                           "this node stops") from None
        if stale:
            raise NodeLost(f"node 0 at {self.cfg.nodes.rdzv_endpoint} stopped answering ({stale[0]}); this node stops")

    def _wait_key(self, key: str) -> bytes:
        while True:
            self._check_node0()
            if self.store.check([key]):
                return self.store.get(key)
            time.sleep(0.2)

    def push_samples(self, rows: list[dict[str, Any]]) -> None:
        if not rows:
            return
        self.store.set(f"smp/{self.rank}/{self._smp}", json.dumps([{**r, "node": self.rank} for r in rows]))
        self._smp += 1
        self.store.add(f"smp/{self.rank}/n", 1)

    def push_event(self, seq: int, line: str) -> None:
        k = self.store.add(f"ev/{seq}/{self.rank}/k", 1) - 1
        self.store.set(f"ev/{seq}/{self.rank}/{k}", line)
        self.store.add(f"ev/{seq}/{self.rank}/n", 1)

    def stopped(self, seq: int) -> bool:
        return self.store.check([f"stop/{seq}"])

    def done(self, seq: int, info: dict[str, Any]) -> None:
        self.store.set(f"done/{seq}/{self.rank}", json.dumps(info))

    def bye(self, why: str) -> None:
        try:
            self.store.set(f"bye/{self.rank}", why)
        except Exception:  # noqa: BLE001 - node 0 may be gone already
            pass
        self._beat.halt.set()
