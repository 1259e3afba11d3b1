"""The backend registry: what each torch.distributed backend can do and how its traffic shows up.

Planner, worker, trace analysis and strategies ask this table instead of comparing bare strings.
Adding a backend (mpi, ucc, xccl) is one entry here; the rest of the harness reads its answers.
"""

from __future__ import annotations

from dataclasses import dataclass

from bench.core.errors import UserError


@dataclass(frozen=True, kw_only=True)
class Backend:
    name: str
    devices: frozenset[str]  # device types its collectives take tensors of
    p2p_on_cuda: bool  # send/recv of CUDA tensors
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
        if self.name == "nccl":
            return "NCCL needs CUDA GPUs; use --backends gloo on CPU"
        return f"backend {self.name} does not run on {device}"

    def p2p_unsupported(self, device: str) -> str | None:
        """None if point-to-point works on ``device`` tensors, else the reason."""
        if device == "cuda" and not self.p2p_on_cuda:
            return (f"{self.name.capitalize()} has no point-to-point for CUDA tensors (torch.distributed "
                    "backend table); use nccl")
        return None

    def comm_in_kernels(self) -> bool:
        return bool(self.kernel_markers)


REGISTRY: dict[str, Backend] = {
    b.name: b
    for b in (
        Backend(name="nccl", devices=frozenset({"cuda"}), p2p_on_cuda=True, kernel_markers=("nccl",),
                bind_device=True, note="GPU collectives as CUDA kernels"),
        Backend(name="gloo", devices=frozenset({"cpu", "cuda"}), p2p_on_cuda=False, span_prefixes=("gloo:",),
                note="host collectives; CUDA tensors are staged through host memory"),
    )
}


def get(name: str) -> Backend:
    try:
        return REGISTRY[name]
    except KeyError:
        raise UserError(f"backend {name!r} unknown; use {' and/or '.join(REGISTRY)}") from None


def names() -> list[str]:
    return list(REGISTRY)


def for_one_process(device: str, asked: list[str]) -> str:
    """The process-group backend that one-process cells (single device, DataParallel, layer split)
    run under: NCCL on CUDA when it was asked for, else Gloo. They do not communicate through it, but
    it is what ran, and the row says so."""
    return "nccl" if device == "cuda" and "nccl" in asked else "gloo"
