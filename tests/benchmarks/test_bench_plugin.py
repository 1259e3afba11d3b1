"""The parbench_cell fixture (bench.gate.pytest_plugin): a world-size-1 cell of a workload and
strategy timed as pytest-benchmark rounds. Importing the fixture is the conftest-free way to
enable it; ``pytest -p bench.gate.pytest_plugin`` enables it for a whole session."""

from bench.gate.pytest_plugin import parbench_cell  # noqa: F401 - the fixture


def test_mlp_single(parbench_cell):  # noqa: F811
    info = parbench_cell("mlp", "single", steps=5, warmup=1)
    assert info["strategy"] == "single" and info["global_batch"] > 0


def test_mlp_ddp_one_rank(parbench_cell):  # noqa: F811
    info = parbench_cell("mlp", "ddp", steps=3, warmup=1)
    assert info["strategy"] == "ddp"
