"""Alpha-beta fit on synthetic sweeps with known parameters, prediction at other world sizes, op
names, and achieved bandwidth of recorded calls against a curve."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from bench.comm.model import annotate_comm, fit, fit_alpha_beta, normalize_op, predict_comm
from bench.comm.ops import busbw_factor

RUN4 = Path(__file__).resolve().parents[1] / "fixtures" / "runs" / "four-gpus-h100"
SIZES = [2**k for k in range(10, 31)]  # 1 KiB .. 1 GiB


def synthetic_sweep(op: str, world: int, regimes: list[tuple[float, float, float, float]], noise: float = 0.02,
                    seed: int = 0) -> pd.DataFrame:
    """Rows of a sweep whose time is alpha + S/beta (within [lo, hi)) times lognormal noise."""
    rng = np.random.default_rng(seed)
    rows = []
    for s in SIZES:
        alpha, beta = next((a, b) for lo, hi, a, b in regimes if lo <= s < hi)
        t = (alpha + s / beta) * math.exp(rng.normal(0, noise))
        for dtype in ("fp32", "bf16"):
            rows.append({"kind": "sweep", "status": "ok", "op": op, "backend": "nccl", "device": "cuda",
                         "world_size": world, "dtype": dtype, "bytes": s, "time_s": t,
                         "busbw_gbs": s / t / 1e9 * busbw_factor(op, world)})
    return pd.DataFrame(rows)


def test_fit_recovers_known_alpha_and_beta_within_5_percent():
    rng = np.random.default_rng(1)
    s = np.array(SIZES, float)
    t = (20e-6 + s / 150e9) * np.exp(rng.normal(0, 0.03, len(s)))
    alpha, beta, rms, mx = fit_alpha_beta(s, t)
    assert alpha == pytest.approx(20e-6, rel=0.05) and beta == pytest.approx(150e9, rel=0.05)
    assert 0.01 < rms < 0.06 and mx >= rms


def test_fit_is_exact_without_noise_and_keeps_alpha_nonnegative():
    s = np.array(SIZES[:8], float)
    alpha, beta, rms, _ = fit_alpha_beta(s, 5e-6 + s / 10e9)
    assert alpha == pytest.approx(5e-6, rel=1e-6) and beta == pytest.approx(10e9, rel=1e-6) and rms < 1e-9
    alpha, beta, _, _ = fit_alpha_beta(s, s / 10e9 * (1 + 0.05 * np.arange(8)))  # would fit alpha < 0
    assert alpha == 0.0 and beta > 0


def test_fit_per_size_range_recovers_each_regime():
    regimes = [(0, 64 * 2**10, 12e-6, 20e9), (64 * 2**10, 8 * 2**20, 25e-6, 120e9), (8 * 2**20, math.inf, 60e-6, 250e9)]
    model = fit(synthetic_sweep("all_reduce", 2, regimes, noise=0.01))
    f = model.fits.sort_values("lo")
    assert len(f) == 3 and list(f["points"]) == [6 * 2, 7 * 2, 8 * 2]  # two dtypes per size
    for (_, row), (_, _, alpha, beta) in zip(f.iterrows(), regimes):
        assert row["alpha_s"] == pytest.approx(alpha, rel=0.05)
        assert row["beta_bps"] == pytest.approx(beta, rel=0.05)
        assert row["busbw_gbs"] == pytest.approx(beta / 1e9 * busbw_factor("all_reduce", 2), rel=0.05)
        assert row["rel_rms"] < 0.03
    s = 2**30
    assert model.predict("all_reduce", "nccl", 2, s) == pytest.approx(60e-6 + s / 250e9, rel=0.02)


def test_predict_other_world_sizes_and_inter_node():
    model = fit(synthetic_sweep("all_reduce", 2, [(0, math.inf, 10e-6, 100e9)], noise=0.0))
    s = 2**28
    # busbw kept (100 GB/s at n=2, factor 1): at n=4 the factor is 1.5, alpha grows with hops x3
    assert model.predict("all_reduce", "nccl", 4, s) == pytest.approx(30e-6 + s * 1.5 / 100e9, rel=1e-3)
    capped = model.predict("all_reduce", "nccl", 16, s, gpus_per_node=8, inter_node_gbs=25.0,
                           inter_node_latency_s=5e-6)
    assert capped == pytest.approx(150e-6 + 5e-6 + s * busbw_factor("all_reduce", 16) / 25e9, rel=1e-3)
    assert math.isnan(model.predict("all_gather", "nccl", 2, s))
    assert math.isnan(model.predict("all_reduce", "gloo", 2, s))


@pytest.mark.parametrize("name, op", [
    ("allreduce", "all_reduce"), ("all_reduce", "all_reduce"), ("all_gather_into_tensor", "all_gather"),
    ("_allgather_base", "all_gather"), ("allgather", "all_gather"), ("reduce_scatter_tensor", "reduce_scatter"),
    ("_reduce_scatter_base", "reduce_scatter"), ("broadcast", "broadcast"), ("send", "sendrecv"), ("recv", "sendrecv"),
    ("SendRecv", "sendrecv"), ("AllReduce_Sum_bf16_RING_LL", "all_reduce"), ("Broadcast_RING_LL", "broadcast"),
    ("alltoall_base", "all_to_all"), ("Reduce_Sum_f32_RING_LL", None), ("barrier", None), (None, None)])
def test_op_names_normalise_through_one_table(name, op):
    assert normalize_op(name) == op


def flat_sweep(busbw: float = 100.0) -> pd.DataFrame:
    rows = [{"kind": "sweep", "status": "ok", "op": op, "backend": "nccl", "device": "cuda", "world_size": n,
             "dtype": "bf16", "bytes": s, "busbw_gbs": busbw, "time_s": s * busbw_factor(op, n) / (busbw * 1e9)}
            for op in ("all_reduce", "all_gather") for n in (2, 4) for s in (2**20, 2**30)]
    return pd.DataFrame(rows)


def comm_rows() -> pd.DataFrame:
    mib = 2.0**20
    rows = [  # (cell, rank, op, bytes, duration): at 100 GB/s busbw a 64 MiB all_reduce on 2 ranks takes S/1e11
        (1, 0, "allreduce", 64 * mib, 64 * mib / 100e9), (1, 1, "allreduce", 64 * mib, 64 * mib / 100e9),
        (1, 0, "allreduce", 64 * mib, 64 * mib / 20e9), (1, 1, "allreduce", 64 * mib, 64 * mib / 20e9 * 1.01),
        (1, 0, "_allgather_base", 16 * mib, 32 * mib * 0.5 / 50e9),
        (1, 1, "_allgather_base", 16 * mib, 32 * mib * 0.5 / 100e9),
        (1, 0, "Broadcast_RING_LL", None, 1e-4),
    ]
    return pd.DataFrame([{"cell_id": c, "rank": r, "backend": "nccl", "world_size": 2, "op": o, "bytes": b,
                          "group_size": 2.0, "start_s": float(i), "duration_s": d}
                         for i, (c, r, o, b, d) in enumerate(rows)])


def test_annotate_comm_ratios_flags_and_late_peers():
    a = annotate_comm(comm_rows(), flat_sweep())
    assert a["ratio"].iloc[:2].to_numpy() == pytest.approx([1.0, 1.0])
    assert a["ratio"].iloc[2] == pytest.approx(0.2) and a["below_curve"].iloc[2]
    assert not a["wait_explains"].iloc[2]  # both ranks slow: no late peer to blame
    # all_gather: recorded bytes are the shard; S = 32 MiB, busbw = S/t * 1/2
    assert a["size_bytes"].iloc[4] == 32 * 2**20
    assert a["ratio"].iloc[4] == pytest.approx(0.5) and a["ratio"].iloc[5] == pytest.approx(1.0)
    assert not a["below_curve"].iloc[4]
    assert a["op_norm"].iloc[6] == "broadcast" and math.isnan(a["ratio"].iloc[6])


def test_annotate_comm_blames_a_late_peer():
    c = comm_rows().iloc[:2].copy()
    c.loc[0, "duration_s"] *= 10  # rank 0 waited: its kernel ran 10x longer than rank 1's
    a = annotate_comm(c, flat_sweep())
    assert a["below_curve"].iloc[0] and a["wait_explains"].iloc[0]
    assert a["peer_best_ratio"].iloc[0] == pytest.approx(1.0)


def test_predict_comm_per_cell():
    model = fit(flat_sweep())
    p = predict_comm(comm_rows(), model, steps=1).set_index("cell_id").loc[1]
    mib = 2.0**20
    expected = (2 * 64 * mib / 100e9 * 2 + 2 * 32 * mib * 0.5 / 100e9) / 2  # per rank
    assert p["predicted_s"] == pytest.approx(expected, rel=0.01)
    assert p["unmodelled_calls"] == 1 and p["unmodelled_s"] == pytest.approx(1e-4 / 2)
    assert p["measured_s"] > p["predicted_s"]


def test_annotate_recorded_run(tmp_path):
    """The committed 4-GPU run's calls all find a curve, sizes follow the group size."""
    comm = pd.read_parquet(RUN4 / "comm.parquet")
    a = annotate_comm(comm, flat_sweep(300.0))
    sized = a[a["bytes"].notna() & a["op_norm"].isin(["all_reduce", "all_gather"])]
    assert sized["ratio"].notna().all() and (sized["ratio"] > 0).all()
    ag = a[(a["op_norm"] == "all_gather") & (a["cell_id"] == 4)]
    assert (ag["size_bytes"] == ag["bytes"] * 4).all()


def test_find_sweep_matches_the_machine_fingerprint(tmp_path):
    import json

    from bench.comm.model import find_sweep

    h100 = {"gpus": ["NVIDIA H100 80GB HBM3"] * 4, "gpu_count": 4, "driver": "580", "torch": "2.11", "nccl": "2.28.9"}
    for run, meta in (("20261126-090000-aaaa", h100), ("20261126-100000-bbbb", {**h100, "nccl": "2.27"}),
                      ("20261126-080000-cccc", h100)):
        (tmp_path / run).mkdir()
        (tmp_path / run / "meta.json").write_text(json.dumps(meta))
        flat_sweep().to_parquet(tmp_path / run / "collectives.parquet")
    assert find_sweep(tmp_path, h100) == tmp_path / "20261126-090000-aaaa" / "collectives.parquet"
    assert find_sweep(tmp_path, {**h100, "gpu_count": 2}) is None
