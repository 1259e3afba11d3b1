"""parbench: benchmark and profile parallelism strategies in PyTorch on the same workload."""

__version__ = "0.1.0"
SCHEMA_VERSION = 1


class UserError(ValueError):
    """Bad user input: the CLI prints the one-line message and exits with code 2."""
