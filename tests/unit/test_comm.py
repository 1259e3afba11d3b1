import math

import pytest

from bench.measure.trace import analyze_trace, breakdown, intersect, length, subtract, union


def test_interval_algebra():
    assert union([(3, 4), (0, 1), (0.5, 2)]) == [(0, 2), (3, 4)]
    assert length([(0, 2), (1, 3), (5, 6)]) == 4
    assert intersect([(0, 2), (3, 5)], [(1, 4)]) == [(1, 2), (3, 4)]
    assert subtract([(0, 10)], [(2, 3), (5, 6)]) == [(0, 2), (3, 5), (6, 10)]


def test_breakdown_overlapped_and_serialized():
    # compute 0-10, comm 2-6 inside it: fully hidden
    hid = breakdown([(0, 10)], [(2, 6)], (0, 10), steps=1)
    assert hid["comm_time_s"] == 4 and hid["exposed_comm_s"] == 0 and hid["overlap_frac"] == 1
    assert hid["idle_frac"] == 0
    # compute 0-6, comm 6-10: fully exposed; two steps halve the per-step times
    ser = breakdown([(0, 6)], [(6, 10)], (0, 12), steps=2)
    assert ser["exposed_comm_s"] == 2 and ser["overlap_frac"] == 0 and ser["compute_time_s"] == 3
    assert ser["idle_frac"] == pytest.approx(2 / 12)
    assert math.isnan(breakdown([(0, 1)], [], (0, 1), 1)["overlap_frac"])


def ev(name, ts, dur, tid=1, cat="cpu_op", **args):
    return {"ph": "X", "name": name, "ts": ts, "dur": dur, "tid": tid, "cat": cat, "args": args}


def test_gloo_trace():
    trace = {"traceEvents": [
        ev("parbench_step", 0, 1000, cat="user_annotation"),
        ev("aten::mm", 0, 600),
        ev("c10d::allreduce_", 100, 50),  # launching, not computing
        ev("gloo:all_reduce", 120, 700, tid=2, cat="user_annotation",
           **{"Input Dims": [[1024]], "Input type": ["float"]}),
    ]}
    bd, rows = analyze_trace(trace, "cpu", steps=1, backend="gloo")
    assert rows == [{"op": "all_reduce", "group_size": None, "bytes": 4096.0, "start_s": pytest.approx(120e-6),
                     "duration_s": pytest.approx(700e-6)}]
    assert bd["comm_time_s"] == pytest.approx(700e-6)
    assert bd["compute_time_s"] == pytest.approx(550e-6)
    assert bd["exposed_comm_s"] == pytest.approx(250e-6)  # 120..150 (caller in c10d) and 600..820


def test_cuda_trace_links_kernels_to_param_comms():
    trace = {"traceEvents": [
        ev("record_param_comms", 0, 30, tid=7, **{"Collective name": "allreduce", "In msg nelems": 100,
                                                   "dtype": "Float", "Group size": 2}),
        ev("cudaLaunchKernel", 10, 5, tid=7, cat="cuda_runtime", correlation=42),
        ev("ncclDevKernel_AllReduce_Sum_f32_RING_LL(x)", 100, 50, tid=0, cat="kernel", correlation=42),
        ev("gemm_kernel", 60, 80, tid=0, cat="kernel", correlation=41),
    ]}
    bd, rows = analyze_trace(trace, "cuda", steps=1)
    assert rows[0]["op"] == "allreduce" and rows[0]["bytes"] == 400 and rows[0]["group_size"] == 2
    assert rows[0]["duration_s"] == pytest.approx(50e-6)
    assert bd["exposed_comm_s"] == pytest.approx(10e-6) and bd["overlap_frac"] == pytest.approx(0.8)


def test_a_group_failed_before_any_result_keeps_the_table():
    """Its only row has no dtype or op: add_reference raised KeyError and the sweep lost its table."""
    import pandas as pd

    from bench.comm.sweep import add_reference

    df = add_reference(pd.DataFrame([{"kind": "sweep", "backend": "gloo", "device": "cpu", "world_size": 2,
                                      "status": "failed", "reason": "group exited timeout"}]))
    assert len(df) == 1 and df["status"].iloc[0] == "failed" and df["vs_reference"].isna().all()


def test_cuda_kernels_take_op_and_bytes_from_a_separate_records_pass():
    """The timing pass has GPU kernels only; the records pass c10d's records. The k-th kernel of a
    kind takes the k-th record of that kind; a kind whose counts differ keeps its kernel name."""
    timing = {"traceEvents": [
        ev("ncclDevKernel_AllGather_RING_LL(x)", 0, 10, tid=0, cat="kernel"),
        ev("gemm_kernel", 10, 80, tid=0, cat="kernel"),
        ev("ncclDevKernel_ReduceScatter_Sum_f32_RING_LL(x)", 60, 40, tid=0, cat="kernel"),
        ev("ncclDevKernel_AllGather_RING_LL(x)", 100, 10, tid=0, cat="kernel"),
        ev("ncclDevKernel_SendRecv(x)", 120, 5, tid=0, cat="kernel"),
    ]}
    rec = lambda name, ts, n: ev("record_param_comms", ts, 1, tid=7, **{"Collective name": name, "In msg nelems": n,
                                                                         "dtype": "Float", "Group size": 4})
    records = {"traceEvents": [rec("all_gather_into_tensor_coalesced", 0, 10), rec("barrier", 1, 1),
                               rec("_reduce_scatter_base", 5, 30), rec("all_gather_into_tensor_coalesced", 9, 20)]}
    bd, rows = analyze_trace(timing, "cuda", steps=1, records=records)
    assert [(r["op"], r["bytes"]) for r in rows] == [
        ("all_gather_into_tensor_coalesced", 40.0), ("_reduce_scatter_base", 120.0),
        ("all_gather_into_tensor_coalesced", 80.0), ("SendRecv", None)]
    assert bd["profiled_step_s"] == pytest.approx(125e-6)
    assert bd["exposed_comm_s"] == pytest.approx(35e-6)  # 0..10, 100..110, 120..125; 60..90 hidden by the gemm


def test_two_groups_kernels_take_records_in_launch_order_and_generic_kernels_in_order():
    """Two groups' all-gathers start on the GPU in the other order than they were launched: the
    correlation id (launch order) pairs them with the records. Kernels of no known kind take the
    records in order when there are as many of each."""
    rec = lambda ts, n, g: ev("record_param_comms", ts, 1, tid=7, **{
        "Collective name": "_allgather_base", "In msg nelems": n, "dtype": "Float", "Group size": g})
    records = {"traceEvents": [rec(0, 10, 2), rec(5, 20, 4)]}
    timing = {"traceEvents": [ev("ncclDevKernel_AllGather_RING_LL(x)", 50, 10, tid=0, cat="kernel", correlation=12),
                              ev("ncclDevKernel_AllGather_RING_LL(x)", 40, 10, tid=0, cat="kernel", correlation=11)]}
    _, rows = analyze_trace(timing, "cuda", steps=1, records=records)
    assert [(r["group_size"], r["bytes"]) for r in rows] == [(4, 80.0), (2, 40.0)]  # the later-launched starts last
    generic = {"traceEvents": [ev("ncclDevKernel_Generic(x)", 40, 10, tid=0, cat="kernel", correlation=11),
                               ev("ncclDevKernel_Generic(x)", 60, 10, tid=0, cat="kernel", correlation=12)]}
    _, rows = analyze_trace(generic, "cuda", steps=1, records=records)
    assert [(r["op"], r["bytes"]) for r in rows] == [("_allgather_base", 40.0), ("_allgather_base", 80.0)]


def test_gloo_spans_keep_the_timing_pass_times_and_take_the_records_pass_bytes():
    timing = {"traceEvents": [ev("parbench_step", 0, 1000, cat="user_annotation"), ev("aten::mm", 0, 600),
                              ev("gloo:all_reduce", 100, 300, tid=2, cat="user_annotation")]}
    records = {"traceEvents": [ev("gloo:all_reduce", 150, 900, tid=2, cat="user_annotation",
                                  **{"Input Dims": [[256]], "Input type": ["float"]})]}
    _, rows = analyze_trace(timing, "cpu", steps=1, backend="gloo", records=records)
    assert rows == [{"op": "all_reduce", "group_size": None, "bytes": 1024.0, "start_s": pytest.approx(100e-6),
                     "duration_s": pytest.approx(300e-6)}]


SPIN = "at::cuda::(anonymous namespace)::spin_kernel(long)"  # torch.cuda._sleep's kernel, as a trace names it


def test_cuda_breakdown_spans_the_steps_between_their_markers():
    """A rank that waits at the start of its step (a later stage of a chain): its kernels span 60 of
    a 100 us step. The window is marker to marker, as the timed CUDA events bracket the step: the
    wait is idle time in it, not missing from it. The warm-up step's end marker and its collective,
    still running when the profiled steps began, are no row of theirs."""
    k = lambda name, ts, dur, c: ev(name, ts, dur, tid=0, cat="kernel", correlation=c)
    timing = {"traceEvents": [
        k(SPIN, 0, 1, 9),  # the warm-up step's end marker
        k("ncclDevKernel_AllReduce_Sum_f32_RING_LL(x)", 0, 20, 8),
        k(SPIN, 1, 1, 10), k("gemm", 42, 50, 11),
        k("ncclDevKernel_SendRecv(x)", 92, 10, 12), k(SPIN, 102, 1, 13),
        k(SPIN, 103, 1, 14), k("gemm", 144, 50, 15),
        k("ncclDevKernel_SendRecv(x)", 194, 10, 16), k(SPIN, 204, 1, 17),
    ]}
    bd, rows = analyze_trace(timing, "cuda", steps=2)
    assert bd["profiled_step_s"] == pytest.approx(100e-6)
    # The warm-up's all-reduce runs 18 us into the first step: it is that step's time, as in a timed one.
    assert bd["compute_time_s"] == pytest.approx(50e-6) and bd["exposed_comm_s"] == pytest.approx(19e-6)
    assert bd["idle_frac"] == pytest.approx(1 - 138 / 200)
    assert [r["op"] for r in rows] == ["SendRecv", "SendRecv"]
    # Without markers: first to last GPU event (the warm-up's all-reduce included).
    plain = {"traceEvents": [e for e in timing["traceEvents"] if e["name"] != SPIN]}
    bd, rows = analyze_trace(plain, "cuda", steps=2)
    assert bd["profiled_step_s"] == pytest.approx(102e-6) and len(rows) == 3


def test_markers_that_do_not_pair_up_give_no_windows():
    """A trace that lost one of its markers would pair a step's end with the next step's start: no
    windows then (the profile pass measures again from a drained device), never shifted ones. A
    collective with no correlation id belongs to the steps when it starts inside one of them."""
    from bench.measure.trace import has_markers, in_steps, step_windows

    k = lambda name, ts, dur, c=None: ev(name, ts, dur, tid=0, cat="kernel", **({"correlation": c} if c else {}))
    marks = [k(SPIN, 0, 1, 10), k(SPIN, 100, 1, 20), k(SPIN, 101, 1, 21), k(SPIN, 200, 1, 30)]
    assert step_windows(marks, 2) is not None and has_markers({"traceEvents": marks}, 2)
    assert step_windows([k(SPIN, -5, 1, 9)] + marks, 2) is not None  # the warm-up's end marker ahead
    assert step_windows(marks[:1] + marks[2:], 2) is None  # one lost
    assert step_windows(marks, 3) is None and not has_markers({"traceEvents": marks[:3]}, 2)
    marked = step_windows(marks, 2)
    kernels = [k("nccl_a", 50, 5, 15), k("nccl_b", 150, 5), k("nccl_c", 100.5, 0.2), k("nccl_d", 250, 5, 40)]
    assert [e["name"] for e in in_steps(kernels, marked)] == ["nccl_a", "nccl_b"]
