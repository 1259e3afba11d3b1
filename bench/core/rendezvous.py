"""Where the nodes of a run over several machines meet: torchrun's c10d rendezvous endpoint and the
node settings, checked before anything launches."""

from __future__ import annotations

import math
import re
from typing import Any

from bench.core.errors import UserError
from bench.core.values import as_float, as_int

#: torchrun's default c10d port; the rendezvous endpoint when --nnodes > 1 comes without one
RDZV_DEFAULT = "127.0.0.1:29400"


def parse_endpoint(text: Any) -> tuple[str, int]:
    """'10.0.0.1:29400', 'node-a:29400', '[fe80::1]:29400' -> (host, port); a one-line UserError
    naming the value and the fix otherwise."""
    t = str(text).strip()
    m = re.fullmatch(r"\[(?P<v6>[0-9A-Fa-f:.%a-z]+)\]:(?P<port>[^:]*)|(?P<host>[A-Za-z0-9_.-]+):(?P<port2>[^:]*)", t)
    if not m:
        raise UserError(f"--rdzv-endpoint {text!r} must be HOST:PORT, e.g. --rdzv-endpoint 10.0.0.1:29400 "
                        "(an IPv6 address in brackets: [fe80::1]:29400)")
    host, port = m["v6"] or m["host"], m["port"] if m["v6"] else m["port2"]
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        raise UserError(f"--rdzv-endpoint {text!r}: port {port!r} must be a number from 1 to 65535, "
                        f"e.g. {host}:29400")
    # a numeric address is checked here (256.1.1.1 waited out the store's 60 s connect timeout before
    # failing); a host name is resolved by the nodes themselves (a Slurm script names one not yet known)
    if m["v6"] or re.fullmatch(r"[0-9.]+", host):
        import ipaddress

        try:
            ipaddress.ip_address(host.split("%")[0])
        except ValueError:
            raise UserError(f"--rdzv-endpoint {text!r}: {host!r} is not an IP address; e.g. "
                            f"--rdzv-endpoint 10.0.0.1:{port} or a host name") from None
    return host, int(port)


def validate_nodes(cfg: Any) -> tuple[int, int, str | None, float]:
    """A RunConfig's (nnodes, node_rank, endpoint, rendezvous timeout) checked: the node rank below the node count,
    an endpoint only for several nodes (loopback by default), every world size above 1 split evenly
    over the nodes."""
    nnodes = as_int("nnodes", cfg.nnodes, "--nnodes 2")
    node_rank = as_int("node_rank", cfg.node_rank, "--node-rank 0")
    timeout = as_float("rdzv_timeout_s", cfg.rdzv_timeout_s, "--rdzv-timeout 300")
    if nnodes < 1:
        raise UserError(f"--nnodes {nnodes} must be >= 1 (the number of machines, each running parbench run)")
    if not 0 <= node_rank < nnodes:
        raise UserError(f"--node-rank {node_rank} must be from 0 to {nnodes - 1} (below --nnodes {nnodes}); "
                        "give each node its own rank, node 0 first")
    if not math.isfinite(timeout) or timeout <= 0:
        raise UserError(f"--rdzv-timeout {cfg.rdzv_timeout_s} must be a finite number of seconds > 0, "
                        "e.g. --rdzv-timeout 300")
    if nnodes == 1:
        if cfg.rdzv_endpoint not in (None, ""):
            raise UserError(f"--rdzv-endpoint {cfg.rdzv_endpoint!r} is for runs on several nodes; add --nnodes N "
                            "(N >= 2) or drop it")
        return 1, 0, None, timeout
    if isinstance(cfg.rdzv_endpoint, str) and not cfg.rdzv_endpoint.strip():
        raise UserError("--rdzv-endpoint '' is empty: give node 0's HOST:PORT, e.g. --rdzv-endpoint 10.0.0.1:29400 "
                        "(or leave it out for loopback, every node on this host)")
    host, port = parse_endpoint(cfg.rdzv_endpoint or RDZV_DEFAULT)
    endpoint = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    bad = [w for w in cfg.world_sizes if w > 1 and w % nnodes]
    if bad:
        raise UserError(f"world size {bad[0]} is not divisible by --nnodes {nnodes}: every node runs the same number "
                        f"of ranks; use multiples of {nnodes}, e.g. --world-sizes {nnodes},{2 * nnodes}")
    return nnodes, node_rank, endpoint, timeout
