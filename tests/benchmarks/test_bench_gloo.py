"""Microbenchmark of a Gloo all_reduce between 2 processes: this test's process is rank 0, a
spawned child is rank 1 and answers every all_reduce until rank 0 raises the stop flag (the flag
rides in the same tensor, so the timed call is one collective and nothing else)."""

import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

NUMEL = 1 << 18  # 1 MiB of fp32


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _peer(port: int) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=1, world_size=2)
    t = torch.zeros(NUMEL + 1)
    while True:
        t.zero_()
        dist.all_reduce(t)
        if t[-1] > 0:  # rank 0 set the flag
            break
    dist.destroy_process_group()


@pytest.fixture
def gloo_pair():
    if dist.is_initialized():
        pytest.skip("a process group is already up in this process")
    port = _free_port()
    ctx = mp.get_context("spawn")
    peer = ctx.Process(target=_peer, args=(port,), daemon=True)
    peer.start()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=2)
    yield
    stop = torch.zeros(NUMEL + 1)
    stop[-1] = 1
    dist.all_reduce(stop)
    dist.destroy_process_group()
    peer.join(timeout=30)
    assert peer.exitcode == 0


def test_gloo_all_reduce_2proc(benchmark, gloo_pair):
    t = torch.ones(NUMEL + 1)
    t[-1] = 0

    def all_reduce():
        t[:-1].fill_(1.0)
        dist.all_reduce(t)

    benchmark.pedantic(all_reduce, rounds=20, warmup_rounds=2, iterations=1)
    assert t[0].item() == 1.0 and t[-1].item() == 0.0  # the peer adds zeros and no stop flag
