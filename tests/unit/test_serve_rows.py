"""Serving rows through the run folder: the schema RunWriter is given accepts every row, load_run
reads them back with parity judged, and the measures come out of the recorded times."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from bench.core.metrics import registry
from bench.results.run import load_run
from bench.results.store import RunWriter, cell_columns, read_table
from bench.serve import schema
from bench.serve.policies import JoinShortestQueue, simulate
from bench.serve.run import parity_err


def _records(n=800, rate=60.0):
    arr = np.cumsum(np.random.default_rng(0).exponential(1 / rate, n))
    tenants = ["a" if i % 4 else "b" for i in range(n)]
    res = simulate(JoinShortestQueue(2, seed=0), arr, [0.02, 0.03], tenants)
    return [{"rid": i, "tenant": tenants[i], "size": 8, "arrival": arr[i], "dispatch": arr[i],
             "worker": int(res.replica[i]), "start": res.start[i], "end": res.end[i], "batch": 1}
            for i in range(n)]


def test_rows_round_trip_through_the_run_folder(tmp_path):
    recs = _records()
    reqs = schema.request_rows(1, recs, {0: "cpu:0", 1: "cpu:1"}, tokens=lambda s: s)
    workers = {w: {"busy_s": sum(r["service_s"] for r in reqs if r["worker"] == w), "served":
                   sum(r["worker"] == w for r in reqs), "peak_mem_bytes": 1e6, "energy_j": None} for w in (0, 1)}
    wall = max(r["end_s"] for r in reqs)
    m = schema.cell_metrics(reqs, workers, wall, samples=lambda s: 1)
    row = {"cell_id": 1, "workload": "gpt-tiny", "strategy": "replicas", "backend": "mp-queue", "device": "cpu",
           "world_size": 2, "status": "ok", "role": "independent", "precision": "fp32", "mode": "serve",
           "serve_policy": "jsq", "parity_rel_err": 0.0, **m}
    w = RunWriter(tmp_path / "run", cell_schema=cell_columns(registry(schema.SERVE_METRICS)), tables=schema.TABLES)
    w.append("requests", reqs)
    w.append("serve_tenants", schema.tenant_rows(1, reqs))
    w.append("cells", [row])
    cells, _, _ = load_run(tmp_path / "run")
    c = cells.iloc[0]
    assert c["mode"] == "serve" and bool(c["parity_ok"])
    assert c["latency_n"] == 800 and c["latency_p99_s"] > c["latency_p90_s"] > c["latency_p50_s"] > 0
    assert c["little_rel_err"] < 0.05
    assert c["queue_mean_s"] + c["service_mean_s"] == pytest.approx(c["latency_mean_s"])
    assert c["serve_achieved_rps"] == pytest.approx(60, rel=0.1)
    assert set(json.loads(c["per_device"])) == {"0", "1"}
    t = read_table(tmp_path / "run", "serve_tenants").set_index("tenant")
    assert t.loc["a", "requests"] == 600 and t.loc["b", "requests"] == 200
    assert np.isnan(t.loc["b", "latency_p99_s"]) and t.loc["b", "latency_p90_s"] > 0  # 200: p99 refused


def test_parity_err():
    ref = [torch.tensor([1.0, -2.0]), torch.tensor([[0.5]])]
    assert parity_err(ref, {0: [t.clone() for t in ref]}) == 0.0
    assert parity_err(ref, {0: [torch.tensor([1.0, -2.02]), ref[1]]}) == pytest.approx(0.01)
    assert parity_err(ref, {0: ref, 1: [ref[0], torch.zeros(2, 1)]}) == float("inf")  # wrong shape


def test_serving_cells_use_the_status_vocabulary_of_every_mode():
    """A serving cell that fails is ``failed`` (as a training cell is), one not run ``skipped``,
    and both start from the shared row start with mode serve."""
    from types import SimpleNamespace as NS

    from bench.core.spec import STATUSES
    from bench.serve.run import ServeRun

    appended = []
    sr = object.__new__(ServeRun)
    from bench.serve.config import ServeConfig

    sr.cfg = ServeConfig(device="cpu", batch_max=4, batch_wait_ms=2.0)
    sr.wl, sr.sm, sr.precision, sr.cell_id = NS(name="mlp", params=10), NS(task="classify"), "fp32", 0
    sr.writer, sr.rows, sr.on_cell = NS(append=lambda table, rows: appended.extend(rows)), [], lambda row: None
    load = NS(label="poisson@5/s", scenario="levels", rate=5.0)
    failed = sr.cell(None, "replicas", 2, "rr", load, None, failure="Traceback ...\nRuntimeError: boom")
    skipped = sr.cell(None, "replicas", 2, "rr", load, None, skip="needs 4 devices")
    assert (failed["status"], failed["reason"]) == ("failed", "RuntimeError: boom")
    assert (skipped["status"], skipped["reason"]) == ("skipped", "needs 4 devices")
    assert {r["status"] for r in appended} <= set(STATUSES) and {r["mode"] for r in appended} == {"serve"}
    assert [r["cell_id"] for r in appended] == [1, 2] and failed["strategy"] == "replicas"
    assert failed["serve_graphs"] is False  # a CPU replica runs its forward eagerly, and the row says so


def test_a_serving_error_row_of_an_older_run_reads_as_failed(tmp_path):
    row = {"cell_id": 1, "workload": "mlp", "strategy": "replicas", "backend": "mp-queue", "device": "cpu",
           "world_size": 2, "status": "error", "reason": "boom", "role": "independent", "mode": "serve"}
    w = RunWriter(tmp_path / "run", cell_schema=cell_columns(registry(schema.SERVE_METRICS)), tables=schema.TABLES)
    w.append("cells", [row])
    cells, _, _ = load_run(tmp_path / "run")
    assert (cells.iloc[0]["status"], cells.iloc[0]["reason"]) == ("failed", "boom")
