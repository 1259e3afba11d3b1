"""`parbench run --nnodes N`: where the rendezvous listens, and the endpoints it cannot use.

The run's stores are unauthenticated, so each must listen only where the run was told to meet: node
0's store on the host of --rdzv-endpoint, torchrun's own stores on their --master-addr or
--local-addr; nothing on every interface. A case watches the sockets that listen while it runs
(this process's on the case's port, and every one of its child processes') and counts one on
another address as lost. Node 0 cases without other nodes end after --rdzv-timeout 2 with one line.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
import time
from pathlib import Path

import psutil
import pytest

from tests.faults.harness import Case, check, params

RUN = ["run", "--workloads", "gpt-tiny", "--strategies", "ddp", "--world-sizes", "2", "--device", "cpu", "--steps",
       "2", "--warmup", "1", "--no-progress", "--out", "{tmp}/out"]
NODE0 = [*RUN, "--nnodes", "2", "--node-rank", "0", "--rdzv-timeout", "2"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _addresses() -> set[str]:
    return {a.address.split("%")[0] for addrs in psutil.net_if_addrs().values() for a in addrs}


#: an address of another machine (documentation ranges) and one of this machine's own, not loopback
FOREIGN = next(a for a in ("198.51.100.7", "203.0.113.7", "192.0.2.77") if a not in _addresses())
OWN = next((a.address for name, addrs in psutil.net_if_addrs().items() for a in addrs
            if a.family == socket.AF_INET and not ipaddress.ip_address(a.address).is_loopback), None)


class Listeners(threading.Thread):
    """The TCP sockets listening while a case runs: this process's on ``port``, and any of its
    child processes' (torchrun agents and ranks of an in-process run, or the command itself)."""

    WATCHES: dict[Path, Listeners] = {}

    def __init__(self, port: int | None):
        super().__init__(daemon=True)
        self.port, self.seen, self.halt = port, {}, threading.Event()

    def run(self) -> None:
        me = psutil.Process()
        while not self.halt.is_set():
            for p in [me, *me.children(recursive=True)]:
                try:
                    for c in p.net_connections("inet"):
                        if c.status == psutil.CONN_LISTEN and (p.pid != me.pid or c.laddr.port == self.port):
                            self.seen.setdefault((c.laddr.ip, c.laddr.port), " ".join(p.cmdline()[1:4]))
                except psutil.Error:
                    continue
            self.halt.wait(0.05)

    def outside(self, allowed: set[str]) -> list[str]:
        self.halt.set()
        self.join()
        return [f"{cmd!r} listened on [{ip}]:{port}" for (ip, port), cmd in sorted(self.seen.items())
                if ip not in allowed]


def _watch(port: int | None):
    def setup(tmp: Path) -> None:
        Listeners.WATCHES[tmp] = w = Listeners(port)
        w.start()
        time.sleep(0.1)

    return setup


def _only_on(*allowed: str, seen: bool = True):
    """What listened on another address than ``allowed`` (and, with ``seen``, that anything listened)."""

    def kept(tmp: Path) -> list[str]:
        w = Listeners.WATCHES.pop(tmp)
        lost = w.outside(set(allowed))
        return lost + (["no listener seen (the watch saw nothing)"] if seen and not w.seen else [])

    return kept


def _hold_port(port: int):
    """A setup that keeps ``port`` on loopback busy (another service) for the case."""
    holders: dict[Path, socket.socket] = {}

    def setup(tmp: Path) -> None:
        s = socket.socket()
        s.bind(("127.0.0.1", port))
        s.listen()
        holders[tmp] = s

    def kept(tmp: Path) -> list[str]:
        holders.pop(tmp).close()
        return []

    return setup, kept


def node0(id: str, endpoint: str, **kw) -> Case:
    return Case(id, "run", [*NODE0, "--rdzv-endpoint", endpoint], **kw)


P = [_free_port() for _ in range(8)]
busy_setup, busy_kept = _hold_port(P[5])
LOOPBACK = {"127.0.0.1", "::1"}

CASES = [
    node0("node0-listens-on-loopback-only", f"127.0.0.1:{P[0]}", setup=_watch(P[0]), kept=_only_on("127.0.0.1"),
          expect=f"node(s) 1 did not join the rendezvous at 127.0.0.1:{P[0]} within 2s"),
    node0("node0-localhost-stays-on-loopback", f"localhost:{P[1]}", setup=_watch(P[1]), kept=_only_on(*LOOPBACK),
          expect="did not join"),
    node0("node0-wildcard-v4-refused", f"0.0.0.0:{P[2]}", setup=_watch(P[2]), kept=_only_on(seen=False),
          expect=f"--rdzv-endpoint 0.0.0.0:{P[2]}: 0.0.0.0 means every interface"),
    node0("node0-wildcard-v6-refused", f"[::]:{P[2]}", expect=f"--rdzv-endpoint [::]:{P[2]}: :: means every interface"),
    Case("node1-wildcard-refused", "run", [*RUN, "--nnodes", "2", "--node-rank", "1", "--rdzv-timeout", "2",
                                           "--rdzv-endpoint", f"0.0.0.0:{P[3]}"], expect="means every interface"),
    node0("node0-other-machines-address", f"{FOREIGN}:{P[4]}", setup=_watch(P[4]), kept=_only_on(seen=False),
          expect=f"{FOREIGN} is not an address of this machine"),
    node0("node0-port-in-use", f"127.0.0.1:{P[5]}", setup=busy_setup, kept=busy_kept, expect="the port is in use"),
    node0("node0-name-does-not-resolve", f"no-such-host.invalid:{P[6]}", expect="does not resolve on node 0"),
]
if OWN is not None:  # a machine with a network interface: node 0 listens on that address, and beats there
    CASES.append(node0("node0-listens-on-its-private-address", f"{OWN}:{P[7]}", setup=_watch(P[7]),
                       kept=_only_on(OWN), expect=f"did not join the rendezvous at {OWN}:{P[7]}"))

#: a whole one-node run: torchrun's own stores listen on loopback (its --master-addr), not everywhere
TORCHRUN = Case("torchrun-stores-on-loopback", "run", RUN, code=0, setup=_watch(None), kept=_only_on(*LOOPBACK),
                subprocess=True, timeout_s=300)


@pytest.mark.parametrize("case", params(CASES))
def test_rendezvous(case: Case, tmp_path: Path) -> None:
    check(case, tmp_path)


@pytest.mark.parametrize("case", params([TORCHRUN]))
def test_torchrun_stores(case: Case, tmp_path: Path) -> None:
    check(case, tmp_path)
