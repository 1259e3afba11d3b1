"""The parbench_cell fixture (bench.gate.pytest_plugin): a world-size-1 cell of a workload and
strategy timed as pytest-benchmark rounds. Importing the fixture is the conftest-free way to
enable it; ``pytest -p bench.gate.pytest_plugin`` enables it for a whole session."""

import gc
import time

import pytest
import torch.distributed as dist

from bench.gate.pytest_plugin import parbench_cell  # noqa: F401 - the fixture


@pytest.fixture
def one_rank_group():
    """A one-process Gloo group that outlives the cell's model. When the plugin starts the group
    itself, the DDP reducer freed as run_cell returns can hold the group's last reference, and
    Gloo's destructor (joining its work threads while holding the GIL) can deadlock with a thread
    that needs the GIL to free its last work. Here the group is destroyed after the model is gone."""
    if dist.is_initialized():
        pytest.skip("a process group is already up in this process")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    gc.collect()
    time.sleep(0.1)  # the work threads finish freeing their last work
    dist.destroy_process_group()


def test_mlp_single(parbench_cell):  # noqa: F811
    info = parbench_cell("mlp", "single", steps=5, warmup=1)
    assert info["strategy"] == "single" and info["global_batch"] > 0


def test_mlp_ddp_one_rank(one_rank_group, parbench_cell):  # noqa: F811
    info = parbench_cell("mlp", "ddp", steps=3, warmup=1)
    assert info["strategy"] == "ddp"
