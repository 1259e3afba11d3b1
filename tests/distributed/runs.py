"""The runs the tests of this folder share (tests/distributed/conftest.py holds them as fixtures)."""

from __future__ import annotations

from pathlib import Path

from bench.core.config import build_config
from bench.train import launcher as launch

#: No sampler, no settling, no steps past ``steps``: correctness is under test, not timing.
QUICK = {"sample_hz": 0, "settle": 0, "target_ci": 0}
# 6 layers + embedding + head = 8 blocks: enough for 4 ranks x 2 interleaved stages.
ZOO_WORKLOAD = "gpt-tiny[n_layer=6]"
#: In-rank faults first (each but the last costs the group a relaunch), healthy strategies after them,
#: and a hang in prepare last: its timeout ends the group with no cell left to relaunch for.
FAULTS = ("tests.helpers:KillsRank,tests.helpers:HangsInCollective,tests.helpers:OutOfMemory,"
          "tests.helpers:Raises,tests.helpers:RaisesMidStep,ddp,tests.helpers:NoAverage,tests.helpers:Inert,"
          "allreduce-bucketed,tests.helpers:Hangs")


def run(out: Path, **flags) -> Path:
    """One ``parbench run`` in this process on CPU (gloo unless ``backends`` says otherwise); its folder."""
    flags = {"device": "cpu", "backends": "gloo", "out": str(out), **flags}
    return launch.run(build_config(toml=None, flags=flags, gpus=0), 0)
