"""Microbenchmark of trace analysis (bench.measure.trace.analyze_trace) on a synthetic NCCL trace."""

from bench.measure.trace import analyze_trace

STEPS, KERNELS, COLLECTIVES = 20, 200, 10


def synthetic_trace() -> dict:
    """A CUDA rank's trace: per step, compute kernels with NCCL kernels overlapping the last half,
    each NCCL kernel launched under a record_param_comms record (the links analyze_trace follows)."""
    ev, t, corr = [], 0.0, 0
    for _ in range(STEPS):
        ev.append(dict(ph="X", name="parbench_step", cat="user_annotation", ts=t, dur=KERNELS * 10.0, tid=1, pid=1))
        for k in range(KERNELS):
            ev.append(dict(ph="X", name=f"gemm_{k % 7}", cat="kernel", ts=t + k * 10, dur=8.0, tid=7, pid=0))
        for c in range(COLLECTIVES):
            ts = t + KERNELS * 5 + c * 90
            corr += 1
            ev.append(dict(ph="X", name="record_param_comms", cat="cpu_op", ts=ts - 5, dur=4.0, tid=1, pid=1,
                           args={"Collective name": "allreduce", "Group size": 2, "In msg nelems": 1 << 20,
                                 "dtype": "Float"}))
            ev.append(dict(ph="X", name="cudaLaunchKernel", cat="cuda_runtime", ts=ts - 3, dur=1.0, tid=1, pid=1,
                           args={"correlation": corr}))
            ev.append(dict(ph="X", name="ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*)", cat="kernel",
                           ts=ts, dur=60.0, tid=9, pid=0, args={"correlation": corr}))
        t += KERNELS * 10 + 50
    return {"traceEvents": ev}


def test_analyze_trace(benchmark):
    trace = synthetic_trace()
    breakdown, rows = benchmark(analyze_trace, trace, "cuda", STEPS, "nccl")
    assert len(rows) == STEPS * COLLECTIVES and all(r["op"] for r in rows)
    assert 0 < breakdown["comm_time_s"] < breakdown["compute_time_s"]
