"""``python -m bench.multinode.torchrun ARGS``: torchrun (``torch.distributed.run``) whose own store
servers listen on the address they are given, not on every interface (:mod:`bench.multinode.binding`):
the static rendezvous of a one-node launch at ``--master-addr``, the c10d rendezvous store where an
agent hosts it, and the store the c10d rank-0 agent shares with its workers at ``--local-addr``.
"""

from __future__ import annotations

from bench.multinode.binding import bound_store


def bind_torchrun_stores() -> None:
    """Make the stores torchrun's rendezvous handlers start :func:`bound_store` ones."""
    from torch.distributed.elastic.rendezvous import c10d_rendezvous_backend, dynamic_rendezvous, static_tcp_rendezvous

    # Each hook is replaced only where this torch has it: a torch that moved one keeps its own
    # (listening on every interface) rather than failing every launch.
    for module in (static_tcp_rendezvous, c10d_rendezvous_backend):
        if hasattr(module, "TCPStore"):
            module.TCPStore = bound_store

    def shared_server(self, master_addr: str, master_port: int):
        return bound_store(master_addr, master_port, is_master=True, multi_tenant=True)

    if hasattr(dynamic_rendezvous.DynamicRendezvousHandler, "_create_tcp_store_server"):
        dynamic_rendezvous.DynamicRendezvousHandler._create_tcp_store_server = shared_server


def main(argv: list[str] | None = None) -> None:
    """torchrun with its store servers bound (see the module doc)."""
    from torch.distributed import run

    bind_torchrun_stores()
    run.main(argv)


if __name__ == "__main__":
    main()
