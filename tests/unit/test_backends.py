"""The backend registry answers every question the harness asks of a backend, and the one status
vocabulary refuses words outside it."""

from __future__ import annotations

import pytest

from bench.core import backends
from bench.core.errors import UserError
from bench.core.spec import STATUSES, ContractError, outcome


def test_defaults_come_from_the_registry():
    assert backends.default_for("cuda").name == "nccl" and backends.default_for("cpu").name == "gloo"
    assert backends.for_one_process("cuda", ["nccl", "gloo"]) == "nccl"
    assert backends.for_one_process("cuda", ["gloo"]) == "gloo"
    assert backends.for_one_process("cpu", ["nccl"]) == "gloo"
    with pytest.raises(UserError):
        backends.default_for("tpu")


def test_what_each_backend_can_do():
    nccl, gloo = backends.get("nccl"), backends.get("gloo")
    assert nccl.stream_ordered and nccl.bind_device and nccl.intra_host_transport
    assert not (gloo.stream_ordered or gloo.bind_device or gloo.intra_host_transport)
    assert nccl.unsupported("cpu") == "NCCL needs CUDA GPUs; use --backends gloo on CPU"
    assert gloo.unsupported("cuda") is None and gloo.p2p_unsupported("cuda").startswith("Gloo has no")
    assert backends.find("mpi") is None and nccl.color != gloo.color


def test_one_status_vocabulary():
    assert STATUSES == ("ok", "failed", "timeout", "skipped")
    assert outcome("skipped", "why") == {"status": "skipped", "reason": "why"}
    for word in ("error", "unsupported"):
        with pytest.raises(ContractError):
            outcome(word, "x")
