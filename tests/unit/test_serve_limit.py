"""What limits a serving cell (bench.serve.limit), on request rows built by hand."""

from __future__ import annotations

import pytest

from bench.serve.limit import gaps, limit


def rows(service_s: float, gap_s: float, n: int, *, worker: int = 0, every_s: float = 0.0, hop_s: float = 0.0,
         batch: int = 1) -> list[dict]:
    """``n`` batches of ``batch`` requests on one process: each computes ``service_s``. With
    ``every_s`` 0 every request is dispatched at time zero (a backlog: each batch waits for the
    process, which spends ``gap_s`` between batches); else one batch arrives every ``every_s`` and
    starts ``hop_s`` after its dispatch."""
    out, t = [], 0.0
    for i in range(n):
        dispatch = 0.0 if every_s == 0 else i * every_s
        start = t + gap_s if every_s == 0 else dispatch + hop_s
        end = start + service_s
        out += [{"worker": worker, "rid": i * batch + k, "dispatch_s": dispatch, "start_s": start, "end_s": end}
                for k in range(batch)]
        t = end
    return out


def test_a_backlogged_process_is_limited_by_its_forward():
    r = rows(2e-3, 1e-4, 500)
    wall = r[-1]["end_s"]
    out = limit(r, wall, achieved_rps=len(r) / wall)
    assert out["serve_limit_kind"] == "forward"
    assert out["serve_gap_mean_s"] == pytest.approx(1e-4)
    assert out["serve_capacity_rps"] == pytest.approx(1 / 2.1e-3, rel=1e-3)
    assert "2.00 ms of each 2.10 ms cycle a request (95%), capacity about 476 req/s" in out["serve_limit"]
    assert "NVML" not in out["serve_limit"]


def test_a_gpu_that_idles_while_the_forward_limits_names_the_kernel_launches():
    r = rows(2e-3, 1e-4, 500)
    out = limit(r, r[-1]["end_s"], achieved_rps=None, gpu_util_pct=35.0)
    assert out["serve_limit_kind"] == "forward" and "kernels 35% of the time" in out["serve_limit"]
    assert "--policy batch" in out["serve_limit"]
    # from CUDA graphs few launches are left: what idles the GPU is the host's work around each replay
    graphed = limit(r, r[-1]["end_s"], achieved_rps=None, gpu_util_pct=48.0, graphs=True)["serve_limit"]
    assert "kernels 48% of the time" in graphed and "around its graph replay" in graphed
    assert "kernel launches" not in graphed
    # a GPU busy most of the time is the limit itself: no such advice
    assert "NVML" not in limit(r, r[-1]["end_s"], achieved_rps=None, gpu_util_pct=95.0)["serve_limit"]


def test_a_process_that_spends_its_cycle_between_batches_is_limited_by_the_harness():
    r = rows(2e-4, 1e-3, 500)
    out = limit(r, r[-1]["end_s"], achieved_rps=None)
    assert out["serve_limit_kind"] == "harness" and "1.00 ms a request between batches" in out["serve_limit"]
    assert out["serve_capacity_rps"] == pytest.approx(1 / 1.2e-3, rel=1e-3)


def test_a_cell_below_capacity_is_limited_by_the_offered_rate():
    r = rows(1e-3, 0.0, 100, every_s=10e-3, hop_s=2e-4)
    wall = r[-1]["end_s"]
    out = limit(r, wall, achieved_rps=len(r) / wall)
    assert out["serve_limit_kind"] == "offered rate" and "busy 12% of the time" in out["serve_limit"]
    # no batch waited: the gap is the dispatch-to-start hop, an upper bound on the overhead
    assert out["serve_gap_mean_s"] == pytest.approx(2e-4)
    assert out["serve_capacity_rps"] == pytest.approx(1 / 1.2e-3, rel=1e-3)


def test_capacity_sums_over_processes_and_counts_batched_requests():
    a, b = rows(2e-3, 0.0, 200, worker=0, batch=4), rows(4e-3, 0.0, 100, worker=1)
    for x in b:
        x["rid"] += 10_000
    out = limit(a + b, 0.4, achieved_rps=None)
    assert out["serve_capacity_rps"] == pytest.approx(4 / 2e-3 + 1 / 4e-3)


def test_gaps_split_waiting_from_idle_batches():
    # the second batch was dispatched before the first ended (it waited); the third after (idle)
    waited, idle = gaps([(0.0, 1.0, 0.0, 1), (1.2, 2.0, 0.5, 1), (3.5, 4.0, 3.0, 1)])
    assert waited == pytest.approx([0.2]) and idle == pytest.approx([0.0, 0.5])


def test_pipelines_and_empty_cells_get_no_limit():
    assert limit(rows(1e-3, 0.0, 10), 1.0, achieved_rps=None, pipeline=True) == {}
    assert limit([], 1.0, achieved_rps=None) == {}
    assert limit(rows(1e-3, 0.0, 10), 0.0, achieved_rps=None) == {}


def test_a_dynamic_batch_short_of_full_waited_for_more_which_is_no_overhead():
    # batches of 3 under a limit of 8: each waited for more requests, by the policy's choice
    # (from when it could start, the previous batch's end: 0.5 s)
    waited, other = gaps([(0.0, 1.0, 0.0, 3), (1.5, 2.0, 0.5, 3)], batch_max=8)
    assert waited == [] and other == pytest.approx([0.0, 0.5])
    waited, _ = gaps([(0.0, 1.0, 0.0, 8), (1.5, 2.0, 0.5, 8)], batch_max=8)
    assert waited == pytest.approx([0.5])


def test_a_backlogged_dynamic_batcher_serves_no_more_than_its_capacity():
    """Batches of 4 under a limit of 8 (the wait ran out), each queued behind the last: the gap is
    counted from the previous batch's end, not from dispatch, so capacity stays above what it served."""
    r = rows(2e-3, 2e-4, 300, batch=4)
    wall = r[-1]["end_s"]
    out = limit(r, wall, achieved_rps=len(r) / wall, batch_max=8)
    assert out["serve_gap_mean_s"] == pytest.approx(2e-4)
    assert out["serve_capacity_rps"] >= len(r) / wall * 0.999 and out["serve_limit_kind"] == "forward"


def test_one_saturated_process_limits_an_uneven_cell():
    """Round-robin over a fast and a slowed replica: the slow one is backlogged, the fast one idles;
    the cell is at the slow one's capacity, not limited by the offered rate."""
    slow = rows(15e-3, 1e-4, 100, worker=1)
    fast = rows(1e-3, 0.0, 100, worker=0, every_s=15e-3, hop_s=1e-4)
    for x in fast:
        x["rid"] += 10_000
    wall = max(x["end_s"] for x in slow)
    out = limit(slow + fast, wall, achieved_rps=200 / wall, slowed=True, gpu_util_pct=10.0)
    assert out["serve_limit_kind"] == "forward", out
    assert out["serve_limit"].startswith("process 1 at capacity, the others busy 7%")
    assert "--slow" in out["serve_limit"] and "NVML" not in out["serve_limit"]


def test_a_cell_answering_most_of_its_capacity_is_at_capacity_even_with_idle_gaps():
    # busy about 80% by the cycle alone, but it answered 90% of its capacity
    r = rows(2e-3, 0.0, 200, every_s=2.5e-3, hop_s=0.0)
    wall = r[-1]["end_s"] * 1.0
    cap = 1 / 2e-3
    out = limit(r, wall, achieved_rps=0.9 * cap)
    assert out["serve_limit_kind"] == "forward"
    assert limit(r, wall, achieved_rps=0.5 * cap)["serve_limit_kind"] == "offered rate"
    assert limit(r, wall, achieved_rps=float("nan"))["serve_limit_kind"] == "offered rate"
