"""parbench: benchmark and profile parallelism strategies in PyTorch on the same workload."""

__version__ = "0.1.0"
SCHEMA_VERSION = 1
