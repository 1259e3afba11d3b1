import json

import matplotlib.pyplot as plt

from bench.results import RunWriter, load_run
from reports import build_report, figures


def fake_run(tmp_path):
    w = RunWriter(tmp_path / "r")
    for cid, (strategy, backend, ws, t) in enumerate([("single", "gloo", 1, 0.1), ("ddp", "gloo", 2, 0.06),
                                                      ("ddp", "nccl", 2, 0.055)]):
        w.add(dict(cell_id=cid, workload="gpt-tiny", strategy=strategy, backend=backend, device="cpu",
                   role="reference" if strategy == "single" else "",
                   world_size=ws, status="ok", precision="fp32", global_batch=8, step_time_median_s=t,
                   step_time_ci_low_s=t * 0.95, step_time_ci_high_s=t * 1.05, throughput_samples_s=8 / t),
              [dict(cell_id=cid, rank=0, step=s, phase="timed", step_time_s=t * (1 + s / 100), loss=1.0,
                    loss_weight=1.0) for s in range(5)])
    w.add(dict(cell_id=3, workload="gpt-tiny", strategy="dataparallel", backend="gloo", device="cpu",
               world_size=2, status="skipped", reason="needs CUDA"))
    (tmp_path / "r" / "meta.json").write_text(json.dumps({"host": "h", "torch": "x"}))
    return w


def test_throughput_bars_draw_one_bar_per_ok_cell(tmp_path):
    fake_run(tmp_path)
    cells, _, _ = load_run(tmp_path / "r")
    ax = figures.throughput_bars(cells, "gpt-tiny")
    assert len(ax.patches) == 3
    assert [t.get_text() for t in ax.get_yticklabels()][0].startswith("ddp gloo x2")
    plt.close(ax.figure)


def test_report_is_self_contained(tmp_path):
    fake_run(tmp_path)
    html = build_report(tmp_path / "r")
    text = html.read_text()
    assert "http://" not in text and "https://" not in text
    for png in ("gpt-tiny-throughput.png", "gpt-tiny-steptime.png", "gpt-tiny-scaling.png"):
        assert png in text and (html.parent / png).stat().st_size > 1000
    assert "needs CUDA" in text
