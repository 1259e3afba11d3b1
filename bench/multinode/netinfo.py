"""Where a rank runs and which network link its traffic to other nodes takes.

Light on purpose (no torch): the worker calls :func:`placement` once per process group, and the
launcher calls :func:`route` for meta.json. The interface is what the backend was told to use
(``GLOO_SOCKET_IFNAME`` / ``NCCL_SOCKET_IFNAME``, the first name of a comma list), else the
interface of the route to the rendezvous host (``MASTER_ADDR``, which torchrun sets to the c10d
store's host). NCCL may still move data over InfiniBand or NVLink where it finds them: for NCCL
the interface is where its sockets go, not a promise that every byte took it.
"""

from __future__ import annotations

import os
import socket
from typing import Any

from bench.core import backends


def configured_iface(backend: str) -> str | None:
    """The interface the backend was told to use, or None (unset, or an exclusion list '^eth1')."""
    var = backends.REGISTRY[backend].socket_ifname_env if backend in backends.REGISTRY else ""
    value = os.environ.get(var, "").strip() if var else ""
    if not value or value.startswith("^"):
        return None
    return value.lstrip("=").split(",")[0].strip() or None


def iface_addr(name: str) -> str:
    """The first IPv4 (else IPv6) address of interface ``name``; '' when it has none."""
    import psutil

    addrs = psutil.net_if_addrs().get(name, [])
    for fam in (socket.AF_INET, socket.AF_INET6):
        for a in addrs:
            if a.family == fam:
                return a.address.split("%")[0]
    return ""


def addr_iface(addr: str) -> str:
    """The interface that holds local address ``addr``; '' when none does."""
    import psutil

    for name, addrs in psutil.net_if_addrs().items():
        if any(a.address.split("%")[0] == addr for a in addrs):
            return name
    return ""


def route(host: str, port: int = 29400) -> tuple[str, str]:
    """(local address, interface) this machine would use to reach ``host`` (a UDP connect sends
    nothing; it only asks the kernel for the route). ('', '') when ``host`` does not resolve."""
    try:
        infos = socket.getaddrinfo(host, port, proto=socket.IPPROTO_UDP)
    except OSError:
        return "", ""
    for fam, _, _, _, sockaddr in infos:
        try:
            with socket.socket(fam, socket.SOCK_DGRAM) as s:
                s.connect(sockaddr)
                local = s.getsockname()[0]
        except OSError:
            continue
        return local, addr_iface(local)
    return "", ""


def link(backend: str) -> tuple[str, str]:
    """(interface, address) this process's traffic to other nodes takes (see the module doc)."""
    name = configured_iface(backend)
    if name:
        return name, iface_addr(name)
    addr, name = route(os.environ.get("MASTER_ADDR", "127.0.0.1"), int(os.environ.get("MASTER_PORT", "29400") or 0))
    return name, addr


def placement(*, rank: int, local_rank: int, backend: str) -> dict[str, Any]:
    """This rank's node (the launcher's --node-rank, passed as PARBENCH_NODE_RANK), host name, link
    and the GPUs it may drive (CUDA_VISIBLE_DEVICES as set for it), and its CPU threads (two launches
    of one cell that differ in OMP_NUM_THREADS can differ in step time, even on GPU)."""
    import torch

    iface, addr = link(backend)
    return {"node_rank": int(os.environ.get("PARBENCH_NODE_RANK", "0") or 0), "host": socket.gethostname(),
            "addr": addr, "iface": iface, "local_rank": local_rank, "threads": torch.get_num_threads()}


def device_names(indices: list[int]) -> list[str]:
    """'cuda:0' per CUDA index, with the physical GPU when CUDA_VISIBLE_DEVICES renumbers them
    ('cuda:0=2': index 0 of this process is GPU 2 of the machine)."""
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    return [f"cuda:{i}={visible[i]}" if i < len(visible) else f"cuda:{i}" for i in indices]
