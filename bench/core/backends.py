"""The backend registry: what each torch.distributed backend can do and how its traffic shows up.

Planner, worker, trace analysis and strategies ask this table instead of comparing bare strings.
Adding a backend (mpi, ucc, xccl) is one entry here; the rest of the harness reads its answers.
"""

from __future__ import annotations

from dataclasses import dataclass

from bench.core.errors import UserError


@dataclass(frozen=True, kw_only=True)
class Backend:
    """One torch.distributed backend and the answers the harness asks of it."""

    name: str
    title: str  # its name in prose ("NCCL", "Gloo")
    devices: frozenset[str]  # device types its collectives take tensors of
    p2p_on_cuda: bool  # send/recv of CUDA tensors
    native: frozenset[str] = frozenset()  # device types it is the default backend of
    # One line on what to use instead where ``devices`` lacks a device (the CLI's advice).
    off_device_hint: str = ""
    # Its collectives are enqueued on a CUDA stream: CUDA events time them and a CUDA graph can
    # capture them.
    stream_ordered: bool = False
    # Ranks of one host exchange data over the host's own links (NVLink, PCIe P2P, shared memory)
    # whatever network interface its sockets name.
    intra_host_transport: bool = False
    color: str = "tab:gray"  # its colour in report figures
    socket_ifname_env: str = ""  # the variable it reads for the network interface between nodes
    # What a budget plan assumes one CUDA cell under it costs beyond its timed steps
    # (bench.plan.budget): seconds a cell, a share per extra rank, seconds per billion parameters,
    # and for a backend whose steps are host all-reduces, per billion parameters at 2(n-1)/n = 1.
    cuda_cell_s: float | None = None
    cuda_per_rank_s: float = 0.0
    cuda_per_bparam_s: float = 0.0
    cuda_ring_per_bparam_s: float = 0.0
    # How its communication appears in a torch.profiler trace: GPU kernels whose name contains one of
    # ``kernel_markers`` (NCCL runs collectives as kernels), or host spans whose name starts with one
    # of ``span_prefixes`` (Gloo annotates the work on its own threads).
    kernel_markers: tuple[str, ...] = ()
    span_prefixes: tuple[str, ...] = ()
    bind_device: bool = False  # init_process_group(device_id=...) binds the rank's GPU eagerly
    note: str = ""

    def unsupported(self, device: str) -> str | None:
        """None if this backend runs collectives on ``device``, else a one-line reason."""
        if device in self.devices:
            return None
        if self.off_device_hint:
            return self.off_device_hint
        return f"backend {self.name} does not run on {device}"

    def p2p_unsupported(self, device: str) -> str | None:
        """None if point-to-point works on ``device`` tensors, else the reason."""
        if device == "cuda" and not self.p2p_on_cuda:
            return (f"{self.title} has no point-to-point for CUDA tensors (torch.distributed "
                    "backend table); use nccl")
        return None

    def comm_in_kernels(self) -> bool:
        """Its communication runs as GPU kernels (a profiler trace shows it on the GPU)."""
        return bool(self.kernel_markers)


REGISTRY: dict[str, Backend] = {
    b.name: b
    for b in (
        Backend(name="nccl", title="NCCL", devices=frozenset({"cuda"}), p2p_on_cuda=True,
                native=frozenset({"cuda"}), off_device_hint="NCCL needs CUDA GPUs; use --backends gloo on CPU",
                stream_ordered=True, intra_host_transport=True, kernel_markers=("nccl",), bind_device=True,
                color="tab:green", socket_ifname_env="NCCL_SOCKET_IFNAME", cuda_cell_s=0.5, cuda_per_rank_s=0.1,
                cuda_per_bparam_s=8.5, note="GPU collectives as CUDA kernels"),
        Backend(name="gloo", title="Gloo", devices=frozenset({"cpu", "cuda"}), p2p_on_cuda=False,
                native=frozenset({"cpu"}), span_prefixes=("gloo:",), color="tab:blue",
                socket_ifname_env="GLOO_SOCKET_IFNAME", cuda_cell_s=0.6, cuda_per_rank_s=0.15, cuda_per_bparam_s=6.0,
                cuda_ring_per_bparam_s=21.0,
                note="host collectives; CUDA tensors are staged through host memory"),
    )
}


def get(name: str) -> Backend:
    """The registry entry of ``name``; a UserError naming the known ones when there is none."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise UserError(f"backend {name!r} unknown; use {' and/or '.join(REGISTRY)}") from None


def find(name: str) -> Backend | None:
    """The registry entry of ``name``, or None (a row of another backend, or of none)."""
    return REGISTRY.get(name)


def names() -> list[str]:
    """The registered backends, in registry order."""
    return list(REGISTRY)


def default_for(device: str) -> Backend:
    """The backend a run on ``device`` uses when none is asked for: the one native to it, else the
    first that runs there."""
    for b in REGISTRY.values():
        if device in b.native:
            return b
    for b in REGISTRY.values():
        if device in b.devices:
            return b
    raise UserError(f"no backend runs on {device!r}; known: {', '.join(REGISTRY)}")


def for_one_process(device: str, asked: list[str]) -> str:
    """The process-group backend that one-process cells (single device, DataParallel, layer split)
    run under: NCCL on CUDA when it was asked for, else Gloo. They do not communicate through it, but
    it is what ran, and the row says so: the backend native to ``device`` when it was asked for, else
    the host's."""
    own = next((b.name for b in REGISTRY.values() if device in b.native), None)
    return own if own in asked else default_for("cpu").name
