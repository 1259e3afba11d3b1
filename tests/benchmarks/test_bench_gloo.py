"""Microbenchmarks of Gloo collectives between 2 processes: this test's process is rank 0, a
spawned child is rank 1. Before each benchmark rank 0 broadcasts (collective, calls); the peer
then joins exactly that many calls of that collective, so each timed call is one collective and
nothing else. Collective 0 tells the peer to leave.

The collectives are the ones the strategies issue: all_reduce (DDP), all_gather and
reduce_scatter (FSDP), broadcast (parameter sync), all_to_all (a sharded exchange), each on 1 MiB
of fp32 per rank."""

from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from bench.runtime.process import free_port

NUMEL = 1 << 18  # 1 MiB of fp32
ROUNDS, WARMUP = 20, 2
TIMEOUT = timedelta(seconds=60)  # a desynchronised pair fails in a minute, not gloo's default 30
OPS = ("all_reduce", "broadcast", "all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single")


def _buffers() -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """(input, output) per collective, allocated once so the timed call allocates nothing."""
    one = lambda: torch.ones(NUMEL)  # noqa: E731 - each collective its own input
    return {"all_reduce": (one(), None), "broadcast": (one(), None),
            "all_gather_into_tensor": (one(), torch.empty(2 * NUMEL)),
            "reduce_scatter_tensor": (one(), torch.empty(NUMEL // 2)),
            "all_to_all_single": (one(), torch.empty(NUMEL))}


def _call(op: str, bufs: dict) -> None:
    x, out = bufs[op]
    if op == "all_reduce":
        x.fill_(1.0)  # on both ranks, so every call's sum is 2 (1 MiB written: part of the timed call)
        dist.all_reduce(x)
    elif op == "broadcast":
        dist.broadcast(x, 0)
    elif op == "all_gather_into_tensor":
        dist.all_gather_into_tensor(out, x)
    elif op == "reduce_scatter_tensor":
        dist.reduce_scatter_tensor(out, x)
    else:
        dist.all_to_all_single(out, x)


def _peer(port: int) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=1, world_size=2,
                            timeout=TIMEOUT)
    bufs = _buffers()
    order = torch.zeros(2, dtype=torch.int64)
    while True:
        dist.broadcast(order, 0)
        op, calls = int(order[0]), int(order[1])
        if op == 0:
            break
        for _ in range(calls):
            _call(OPS[op - 1], bufs)
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def gloo_pair():
    if dist.is_initialized():
        pytest.skip("a process group is already up in this process")
    port = free_port()
    ctx = mp.get_context("spawn")
    peer = ctx.Process(target=_peer, args=(port,), daemon=True)
    peer.start()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=2, timeout=TIMEOUT)
    yield _buffers()
    dist.broadcast(torch.zeros(2, dtype=torch.int64), 0)
    dist.destroy_process_group()
    peer.join(timeout=30)
    assert peer.exitcode == 0


@pytest.mark.parametrize("op", OPS)
def test_gloo_collective_2proc(benchmark, gloo_pair, op, request):
    if request.config.getoption("benchmark_cprofile", None):
        pytest.skip("--benchmark-cprofile calls the function more often than the peer is told")
    bufs = gloo_pair
    # With --benchmark-disable (the suite's default) pedantic calls the function once.
    calls = 1 if benchmark.disabled else ROUNDS + WARMUP
    dist.broadcast(torch.tensor([OPS.index(op) + 1, calls]), 0)
    benchmark.pedantic(_call, args=(op, bufs), rounds=ROUNDS, warmup_rounds=WARMUP, iterations=1)
    x, out = bufs[op]
    if op == "all_reduce":
        assert x[0].item() == 2.0  # both ranks' ones
    elif op == "all_gather_into_tensor":
        assert out.shape[0] == 2 * NUMEL and out[-1].item() == 1.0
    elif op == "reduce_scatter_tensor":
        assert out[0].item() == 2.0
    elif op == "all_to_all_single":
        assert out.shape[0] == NUMEL and out[-1].item() == 1.0
    else:  # broadcast from rank 0 of ones
        assert x[0].item() == 1.0
