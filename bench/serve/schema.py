"""Serving columns and rows: the cells row of a serving cell, its per-tenant rows, its request rows.

A serving cell reuses the core cell columns that mean the same thing (workload, strategy = the
placement, backend = the transport, device, world_size, status, reason, throughput_samples_s,
peak memory, energy, parity) and adds its own through :data:`SERVE_METRICS` (defined with the other
cell columns in :mod:`bench.results.serve_columns`), which the run passes to
``RunWriter(cell_schema=...)``. ``mode`` is ``serve`` on every serving row.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from bench.results.serve_columns import SERVE_METRICS  # noqa: F401 - the serving run and its tests read it here
from bench.stats import serving as stats

REQUEST_COLUMNS: dict[str, str] = {
    "run_id": "string", "cell_id": "Int64", "rid": "Int64", "tenant": "string", "worker": "Int64",
    "device": "string", "arrival_s": "float64", "dispatch_s": "float64", "start_s": "float64", "end_s": "float64",
    "size": "Int64", "tokens": "Int64", "batch": "Int64", "latency_s": "float64", "queue_s": "float64",
    "service_s": "float64",
}
TENANT_COLUMNS: dict[str, str] = {
    "run_id": "string", "cell_id": "Int64", "tenant": "string", "requests": "Int64", "achieved_rps": "float64",
    "latency_n": "Int64", "latency_p50_s": "float64", "latency_p90_s": "float64", "latency_p95_s": "float64",
    "latency_p99_s": "float64", "latency_mean_s": "float64", "queue_mean_s": "float64", "service_mean_s": "float64",
    "devices": "string",
}
TABLES = {"requests": REQUEST_COLUMNS, "serve_tenants": TENANT_COLUMNS}


def request_rows(cell_id: int, records: list[dict[str, Any]], devices: dict[int, str],
                 tokens: Any) -> list[dict[str, Any]]:
    """One row per answered request; times in seconds from the cell's time zero."""
    out = []
    for r in records:
        if "end" not in r:
            continue
        out.append({"cell_id": cell_id, "rid": r["rid"], "tenant": r["tenant"], "worker": r["worker"],
                    "device": devices.get(r["worker"], ""), "arrival_s": r["arrival"], "dispatch_s": r["dispatch"],
                    "start_s": r["start"], "end_s": r["end"], "size": r["size"], "tokens": tokens(r["size"]),
                    "batch": r["batch"], "latency_s": r["end"] - r["arrival"], "queue_s": r["start"] - r["arrival"],
                    "service_s": r["end"] - r["start"]})
    return out


def _latency_block(rows: list[dict[str, Any]]) -> dict[str, Any]:
    lat = np.array([r["latency_s"] for r in rows], float)
    p = stats.percentiles(lat)
    arr = np.array([r["arrival_s"] for r in rows], float)
    end = np.array([r["end_s"] for r in rows], float)
    span = float(end.max() - arr.min()) if len(rows) else float("nan")
    return {"latency_n": p["n"], "latency_p50_s": p["p50"], "latency_p90_s": p["p90"], "latency_p95_s": p["p95"],
            "latency_p99_s": p["p99"], "latency_mean_s": float(lat.mean()) if len(lat) else float("nan"),
            "queue_mean_s": float(np.mean([r["queue_s"] for r in rows])) if rows else float("nan"),
            "service_mean_s": float(np.mean([r["service_s"] for r in rows])) if rows else float("nan"),
            "achieved_rps": len(rows) / span if span > 0 else float("nan")}


def tenant_rows(cell_id: int, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per tenant of a cell: its requests' throughput and latency."""
    out = []
    for t in sorted({r["tenant"] for r in rows}):
        mine = [r for r in rows if r["tenant"] == t]
        b = _latency_block(mine)
        out.append({"cell_id": cell_id, "tenant": t, "requests": len(mine),
                    "devices": ",".join(sorted({r["device"] for r in mine})), **b})
    return out


def cell_metrics(rows: list[dict[str, Any]], workers: dict[int, dict[str, Any]], wall_s: float,
                 samples: Any) -> dict[str, Any]:
    """The measured serving columns of a cell from its request rows and process stats."""
    b = _latency_block(rows)
    ll = stats.littles_law(np.array([r["arrival_s"] for r in rows]), np.array([r["end_s"] for r in rows]))
    busy = [w.get("busy_s", 0.0) for _, w in sorted(workers.items())]
    served = [w.get("served", 0) for _, w in sorted(workers.items())]
    energy = [w.get("energy_j") for w in workers.values()]
    mem = [w.get("peak_mem_bytes") for w in workers.values() if w.get("peak_mem_bytes") is not None]
    e_total = sum(energy) if energy and all(e is not None for e in energy) else None
    span = 1.0 / b["achieved_rps"] * len(rows) if rows and b["achieved_rps"] == b["achieved_rps"] else float("nan")
    per_dev = {str(i): {"requests": w.get("served"), "busy_s": round(w.get("busy_s", 0.0), 6),
                        "util": round(w.get("busy_s", 0.0) / wall_s, 4) if wall_s > 0 else None,
                        "peak_mem_bytes": w.get("peak_mem_bytes"), "energy_j": w.get("energy_j"),
                        **({"inflight_max": w["inflight_max"]} if "inflight_max" in w else {})}
               for i, w in sorted(workers.items())}
    lat = np.array([r["latency_s"] for r in rows], float)
    q = np.array([r["queue_s"] for r in rows], float)
    return {
        "latency_n": b["latency_n"], "latency_p50_s": b["latency_p50_s"], "latency_p90_s": b["latency_p90_s"],
        "latency_p95_s": b["latency_p95_s"], "latency_p99_s": b["latency_p99_s"],
        "latency_mean_s": b["latency_mean_s"], "latency_refused": ", ".join(stats.refused(len(rows))) or None,
        "queue_mean_s": b["queue_mean_s"], "service_mean_s": b["service_mean_s"],
        "queue_frac": float(np.mean(q / np.maximum(lat, 1e-12))) if rows else None,
        "serve_achieved_rps": b["achieved_rps"], "serve_requests_done": len(rows),
        "throughput_samples_s": sum(samples(r["size"]) for r in rows) / span if span == span and span > 0 else None,
        "serve_batch_mean": float(np.mean([r["batch"] for r in rows])) if rows else None,
        "util_mean": float(np.mean(busy)) / wall_s if busy and wall_s > 0 else None,
        "util_imbalance": stats.imbalance(busy), "requests_imbalance": stats.imbalance(served),
        "peak_mem_bytes": max(mem) if mem else None, "energy_j": e_total,
        "energy_per_request_j": e_total / len(rows) if e_total is not None and rows else None,
        "little_L": ll["L"], "little_lambda_W": ll["lambda_W"], "little_rel_err": ll["rel_err"],
        "per_device": json.dumps(per_dev),
    }
