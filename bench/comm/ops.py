"""The collectives and dtypes `parbench comm` sweeps, by name: torch-free, for the CLI's flags
(:mod:`bench.comm.worker` maps them to torch)."""

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all", "sendrecv")
DTYPE_NAMES = ("fp32", "bf16")
