"""The serving mode's cell columns (:data:`SERVE_METRICS`): declared here, in the results layer, so
that the table readers (:mod:`bench.results.columns`) know them without importing the serving code.
"""

from __future__ import annotations

from bench.core.metrics import Metric, R, S

_ms = dict(dtype="float64", unit="s", scale=1e3, fmt=".2f")

SERVE_METRICS: tuple[Metric, ...] = (
    Metric(name="mode", dtype="string", kind="key", shown=S, doc="train, serve or collective"),
    Metric(name="serve_policy", dtype="string", kind="label", header="policy", shown=S,
           doc="balancing policy (replicas), pinned (pinned-tenants) or '-' (one entry process)"),
    Metric(name="serve_load", dtype="string", kind="label", header="load", shown=S,
           doc="arrival process and offered rate, e.g. poisson@50/s, closed@4"),
    Metric(name="serve_scenario", dtype="string", kind="label",
           doc="levels (a load level), sweep (the rate sweep), noisy-alone / noisy-flood (noisy neighbour)"),
    Metric(name="serve_task", dtype="string", kind="fact", doc="score, generate or classify"),
    Metric(name="serve_graphs", dtype="boolean", kind="fact",
           doc="the processes replayed their forward from CUDA graphs (--graphs auto), not eagerly"),
    Metric(name="serve_offered_rps", dtype="float64", unit="requests/s", doc="scheduled arrivals per second"),
    Metric(name="serve_achieved_rps", dtype="float64", unit="requests/s", header="req/s", fmt=".1f", shown=S,
           higher_is_better=True, compared=True, doc="answered requests / (last answer - first arrival)"),
    Metric(name="serve_tokens_s", dtype="float64", unit="tokens/s", higher_is_better=True,
           doc="prompt and generated tokens per second (GPT)"),
    Metric(name="serve_requests", dtype="Int64", doc="requests sent"),
    Metric(name="serve_requests_done", dtype="Int64", doc="requests answered"),
    Metric(name="serve_batch_max", dtype="Int64", kind="fact", doc="dynamic batching: most requests in a batch"),
    Metric(name="serve_batch_wait_s", **_ms, kind="fact", doc="dynamic batching: longest wait for a fuller batch"),
    Metric(name="serve_batch_mean", dtype="float64", doc="requests per batch, mean over requests"),
    Metric(name="latency_n", dtype="Int64", doc="latencies the percentiles are over"),
    Metric(name="latency_p50_s", **_ms, header="p50 ms", shown=S, higher_is_better=False, compared=True),
    Metric(name="latency_p90_s", **_ms, header="p90 ms", higher_is_better=False,
           doc="refused (empty) under 64 requests: LoadGen's early-stopping rule, see bench/stats/serving.py"),
    Metric(name="latency_p95_s", **_ms, header="p95 ms", higher_is_better=False),
    Metric(name="latency_p99_s", **_ms, header="p99 ms", shown=S, higher_is_better=False, compared=True,
           doc="refused (empty) under 662 requests"),
    Metric(name="latency_mean_s", **_ms, higher_is_better=False),
    Metric(name="latency_refused", dtype="string", doc="percentiles refused for too few samples"),
    Metric(name="queue_mean_s", **_ms, header="queue ms", shown=R,
           doc="mean of start - arrival: waiting for a process (and for a fuller batch)"),
    Metric(name="service_mean_s", **_ms, header="compute ms", shown=R, doc="mean of end - start: computing"),
    Metric(name="queue_frac", dtype="float64", unit="fraction", fmt=".0%", doc="queue / latency, mean over requests"),
    Metric(name="dispatch_lag_max_s", **_ms, doc="latest the launcher sent a request after its scheduled arrival"),
    Metric(name="util_mean", dtype="float64", unit="fraction", fmt=".0%", header="util", shown=R,
           doc="busy time / cell wall time, mean over processes"),
    Metric(name="serve_gap_mean_s", **_ms, higher_is_better=False,
           doc="a process's time between batches while the next was waiting (queue hop, inputs, answers: the "
               "harness's share of a cycle); below capacity, dispatch to start of batches that found it idle"),
    Metric(name="serve_capacity_rps", dtype="float64", unit="requests/s", fmt=".1f", higher_is_better=True,
           doc="what the processes would serve if never idle: requests / (forward + one gap per batch), "
               "summed over processes (bench.serve.limit; empty for pipelines)"),
    Metric(name="serve_limit_kind", dtype="string", header="limited by", shown=R,
           doc="forward, harness or offered rate: what limits the cell's throughput (bench.serve.limit)"),
    Metric(name="serve_limit", dtype="string", doc="what limits the cell's throughput, with its figures"),
    Metric(name="util_imbalance", dtype="float64", header="imbalance", fmt=".2f", shown=R,
           doc="max / mean busy time over processes (1 = even)"),
    Metric(name="requests_imbalance", dtype="float64", fmt=".2f", doc="max / mean requests per process"),
    Metric(name="energy_per_request_j", dtype="float64", unit="J", higher_is_better=False,
           doc="NVML energy of the cell's GPUs / requests answered (empty on CPU)"),
    Metric(name="little_L", dtype="float64", doc="mean requests in system, sampled (steady window)"),
    Metric(name="little_lambda_W", dtype="float64", doc="arrival rate x mean time in system (steady window)"),
    Metric(name="little_rel_err", dtype="float64", fmt=".1%", doc="|L - lambda W| / lambda W"),
    Metric(name="slo_s", **_ms, kind="fact", doc="latency target of the sweep (p99)"),
    Metric(name="slo_met", dtype="boolean",
           doc="p99 reported and within slo_s, the cell answered >= 90% of its realised arrival rate, "
               "and (open loop) its backlog was steady (no steady-state flag in noise)"),
    Metric(name="per_device", dtype="string", doc="JSON per process: requests, busy, utilisation, memory, energy"),
)
