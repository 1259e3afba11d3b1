"""Where the stores of a run listen: on the address they were given, nowhere else.

``torch.distributed.TCPStore(host, port, is_master=True)`` listens on every interface (``::``,
which takes IPv4 too), whatever ``host`` says: ``host`` is only where its own client connects. The
stores of a run are unauthenticated (anyone who reaches the port can read and write every key, and
so join the rendezvous or speak the launchers' protocol), so they listen where the run was told
to meet: :func:`bound_store` binds a socket to ``host`` first and hands it to the store
(``master_listen_fd``; the store owns it from then on and closes it). :func:`serve` is node 0's
store at ``--rdzv-endpoint``, with a one-line error for each way that fails;
:mod:`bench.multinode.torchrun` binds torchrun's own stores the same way.
"""

from __future__ import annotations

import errno
import ipaddress
import logging
import socket
from datetime import timedelta
from typing import Any

from bench.core.errors import UserError

log = logging.getLogger("parbench")


def listening_socket(host: str, port: int) -> socket.socket:
    """A TCP socket listening on ``host``'s first address at ``port`` (0: any free port). OSError
    when ``host`` does not resolve (socket.gaierror) or is not an address of this machine."""
    family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    try:
        # as TCPStore's own listener does: a port left in TIME_WAIT by a store that just ended is free
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(1024)
    except OSError:
        sock.close()
        raise
    return sock


def bound_store(host_name: str, port: int, *args: Any, **kwargs: Any):
    """``torch.distributed.TCPStore(host_name, port, ...)``, same arguments; a server
    (``is_master``) listens on ``host_name`` only."""
    from torch.distributed import TCPStore

    is_master = kwargs.get("is_master", args[1] if len(args) > 1 else False)
    if not is_master or kwargs.get("master_listen_fd") is not None:
        return TCPStore(host_name, port, *args, **kwargs)
    sock = listening_socket(host_name, port)
    try:
        store = TCPStore(host_name, sock.getsockname()[1], *args, **kwargs, master_listen_fd=sock.fileno())
    except BaseException:
        sock.close()
        raise
    sock.detach()  # the store's now: it closes it when it goes
    return store


def refuse_wildcard(endpoint: str, host: str, port: int) -> None:
    """A one-line UserError for an endpoint that means every interface (0.0.0.0, ::): the other nodes
    connect to the endpoint, so it must be node 0's address, and node 0 listens there only."""
    try:
        wild = ipaddress.ip_address(host.split("%")[0]).is_unspecified
    except ValueError:
        wild = False
    if wild:
        raise UserError(f"--rdzv-endpoint {endpoint}: {host} means every interface, not an address the other nodes "
                        f"can connect to; give node 0's address on a private network, e.g. 10.0.0.1:{port} (the "
                        "rendezvous listens there only)")


def serve(endpoint: str, host: str, port: int):
    """Node 0's store at ``host:port`` (from ``endpoint``), listening there only; a one-line UserError
    when it cannot (the name does not resolve, the address is another machine's, the port is taken)."""
    try:
        server = bound_store(host, port, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=60))
    except Exception as e:  # noqa: BLE001 - OSError, DistNetworkError and friends: say what to do
        code = getattr(e, "errno", None)
        if isinstance(e, socket.gaierror):
            raise UserError(f"--rdzv-endpoint {endpoint}: {host!r} does not resolve on node 0 ({e.strerror}); give "
                            f"node 0's address, e.g. 10.0.0.1:{port}") from None
        if code == errno.EADDRNOTAVAIL:
            raise UserError(f"--rdzv-endpoint {endpoint}: {host} is not an address of this machine, so node 0 cannot "
                            "listen there; start --node-rank 0 on the machine that has it, or give this machine's "
                            "address on the private network") from None
        text = " ".join(str(e).split())
        why = "the port is in use" if code == errno.EADDRINUSE or "in use" in text else text[:120]
        raise UserError(f"--rdzv-endpoint {endpoint}: node 0 cannot host the rendezvous on port {port} ({why}); "
                        "is another node started with --node-rank 0? pick a free port and pass the same endpoint "
                        "to every node") from None
    bound = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][4][0]
    if _is_loopback(bound) and not (host == "localhost" or _is_loopback(host)):
        log.warning("--rdzv-endpoint %s: %s is %s (loopback) on node 0, so the rendezvous listens there only and "
                    "nodes on other machines cannot join; give node 0's address on the private network",
                    endpoint, host, bound)
    return server


def _is_loopback(addr: str) -> bool:
    try:
        return ipaddress.ip_address(addr.split("%")[0]).is_loopback
    except ValueError:
        return False
