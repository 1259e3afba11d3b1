"""The collectives and dtypes `parbench comm` sweeps, by name, and the bus-bandwidth arithmetic
of nccl-tests: torch-free, for the CLI's flags and the readers of a sweep (:mod:`bench.comm.worker`
maps them to torch)."""

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all", "sendrecv")
DTYPE_NAMES = ("fp32", "bf16")
GB = 1e9  # nccl-tests reports GB/s with GB = 1e9 bytes


def busbw_factor(op: str, n: int) -> float:
    """nccl-tests' correction from algorithm to bus bandwidth for ``n`` ranks."""
    if n <= 1:
        return 1.0
    if op == "all_reduce":
        return 2.0 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    return 1.0  # broadcast, reduce, sendrecv
