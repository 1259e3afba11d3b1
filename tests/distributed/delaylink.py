"""A point-to-point IP link between two network namespaces with a known one-way delay, made in user
space: where the kernel has no ``sch_netem`` (``tc qdisc add ... netem`` answers "Specified qdisc
kind is unknown", as on this project's machines), ``tc`` cannot add a delay.

    python -m tests.distributed.delaylink NS0 DEV0 ADDR0 NS1 DEV1 ADDR1 DELAY_MS

One TUN device in each namespace (``DEV0`` in ``NS0`` with ``ADDR0``, peer ``ADDR1``; and the
mirror in ``NS1``), opened by this process, which relays every IP packet read from one to the other
after ``DELAY_MS`` (each packet is held until its own arrival time plus the delay, so the order and
the spacing of packets are kept, as netem's fixed delay does). It prints ``ready`` once both devices
are up, and relays until it is terminated (SIGTERM); the devices vanish with it. Needs root
(network namespaces, /dev/net/tun).

The relay's own cost is measured by running it at 0 ms: the tests compare a link with the delay to
the same link without, so only the injected delay is under test.
"""

from __future__ import annotations

import ctypes
import fcntl
import heapq
import os
import selectors
import signal
import struct
import subprocess
import sys
import time

TUNSETIFF = 0x400454CA
IFF_TUN, IFF_NO_PI = 0x0001, 0x1000
CLONE_NEWNET = 0x40000000
MTU = 9000  # fewer, larger packets for the relay to move (the link's bandwidth is not under test)


def _setns(name: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/var/run/netns/{name}", os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns into {name}: {os.strerror(err)}")
    finally:
        os.close(fd)


def _tun(name: str) -> int:
    fd = os.open("/dev/net/tun", os.O_RDWR)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TUN | IFF_NO_PI))
    os.set_blocking(fd, False)
    return fd


def _ip(ns: str, *args: str) -> None:
    subprocess.run(["ip", "-n", ns, *args], check=True, capture_output=True, text=True, timeout=30)


def open_link(ns: tuple[str, str], dev: tuple[str, str], addr: tuple[str, str]) -> tuple[int, int]:
    """Both TUN devices (each created in its namespace), addressed point to point and up."""
    home = os.open("/proc/self/ns/net", os.O_RDONLY)
    libc = ctypes.CDLL(None, use_errno=True)
    fds = []
    try:
        for n, d in zip(ns, dev):
            _setns(n)
            fds.append(_tun(d))
    finally:
        libc.setns(home, CLONE_NEWNET)
        os.close(home)
    for n, d, a, peer in zip(ns, dev, addr, addr[::-1]):
        _ip(n, "addr", "add", a, "peer", peer, "dev", d)
        _ip(n, "link", "set", d, "mtu", str(MTU), "up")
    return fds[0], fds[1]


def relay(a: int, b: int, delay_s: float, stop) -> None:
    """Move packets a -> b and b -> a, each ``delay_s`` after it was read, until ``stop()``."""
    sel = selectors.DefaultSelector()
    sel.register(a, selectors.EVENT_READ, b)
    sel.register(b, selectors.EVENT_READ, a)
    due: list[tuple[float, int, int, bytes]] = []  # (time to send, sequence, out fd, packet)
    seq = 0
    while not stop():
        now = time.monotonic()
        while due and due[0][0] <= now:
            _, _, out, pkt = heapq.heappop(due)
            try:
                os.write(out, pkt)
            except BlockingIOError:  # the receiving side's queue is full: a loss, as a full link's
                pass
        wait = max(due[0][0] - now, 0.0) if due else 0.5
        for key, _ in sel.select(timeout=wait):
            while True:
                try:
                    pkt = os.read(key.fd, 65536)
                except BlockingIOError:
                    break
                seq += 1
                heapq.heappush(due, (time.monotonic() + delay_s, seq, key.data, pkt))


def main(argv: list[str]) -> int:
    if len(argv) != 7:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    ns, dev, addr = (argv[0], argv[3]), (argv[1], argv[4]), (argv[2], argv[5])
    delay_s = float(argv[6]) / 1e3
    a, b = open_link(ns, dev, addr)
    stopped = []
    signal.signal(signal.SIGTERM, lambda *_: stopped.append(1))
    print("ready", flush=True)
    relay(a, b, delay_s, lambda: bool(stopped))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
