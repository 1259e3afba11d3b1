"""Serving from CUDA graphs on a GPU: skipped cleanly without CUDA; run on the device machine with
`pytest tests/gpu`."""

from __future__ import annotations

import pytest
import torch

from bench.measure.hardware import gpu_count
from bench.serve.models import Graphed, ServeModel, run_grouped, run_padded
from bench.workloads import resolve

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(gpu_count() < 1, reason="needs a CUDA GPU")]


def test_graphed_answers_match_eager_for_every_shape_and_replay_after_capture():
    dev = torch.device("cuda:0")
    sm = ServeModel.create(resolve("gpt-tiny", seed=0), task="score", gen_tokens=0, seed=0)
    eager = sm.runner(sm.build(dev, torch.bfloat16))
    graphed = Graphed(eager, dev)
    with torch.no_grad():
        for n in (16, 17, 40, 16):  # a shape seen again replays its graph
            x = sm.make_input(n, n)
            a = run_grouped(eager, [x], dev, torch.bfloat16)[0]
            b = run_grouped(graphed, [x], dev, torch.bfloat16)[0]
            torch.testing.assert_close(a, b)
        xs = [sm.make_input(i, n) for i, n in enumerate((20, 33, 31))]  # a padded batch, lengths beside
        for a, b in zip(run_padded(eager, xs, dev, sm.max_size), run_padded(graphed, xs, dev, sm.max_size)):
            torch.testing.assert_close(a, b)
    assert len(graphed.graphs) == 4  # (1, 16), (1, 17), (1, 40) and the padded (3, 48) with its lengths


def test_a_replica_serves_from_graphs_and_says_so(tmp_path):
    from bench.cli.main import main

    rc = main(["serve", "--workload", "gpt-tiny", "--world-sizes", "1", "--policies", "round-robin",
               "--rates", "200", "--duration", "1", "--size", "uniform", "--size-min", "16", "--size-max", "48",
               "--out", str(tmp_path)])
    assert rc == 0
    from bench.results.run import load_run

    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    cells = load_run(run_dir)[0]
    assert cells["serve_graphs"].all() and (cells["status"] == "ok").all()
    assert cells["parity_rel_err"].notna().all()  # the parity probe ran, through the graphs


def test_a_forward_that_cannot_be_captured_names_the_shape_and_the_way_out():
    dev = torch.device("cuda:0")

    def syncs(x):  # reads a value on the host mid-forward: no graph can hold that
        return x * float(x.sum().item())

    way_out = r"CUDA graph capture failed at input shape \(1, 4\); --graphs off serves it eagerly: "
    with pytest.raises(RuntimeError, match=way_out):
        Graphed(syncs, dev)(torch.ones(1, 4, device=dev))
