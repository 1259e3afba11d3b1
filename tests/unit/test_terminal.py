"""The end of `parbench run` on a terminal and in a log: a summary that fits 100 columns with the
recommendation last, the table of every cell only when asked, and progress without a terminal as
one line per finished cell, never bar redraws."""

from __future__ import annotations

import io
import itertools
import json
from types import SimpleNamespace as NS

import pytest
from rich.console import Console

from bench.cli.main import main
from bench.cli.progress import MatrixProgress
from bench.cli.run import print_recommendation
from bench.cli.summary import LOOK_MAX, print_summary
from bench.results.store import RunWriter

STRATEGIES = ["ddp", "fsdp", "fsdp-noreshard", "allreduce", "allreduce-bucketed", "tensor", "pipeline-gpipe",
              "pipeline-1f1b", "chain", "layersplit", "ensemble", "dataparallel"]


def big_run(tmp_path):
    """99 cells as a CPU matrix leaves them: two workloads, two backends, two world sizes, a long
    reason or two, failures, a parity failure, noisy cells and skipped ones."""
    d = tmp_path / "20261127-120000-abcd"
    w = RunWriter(d)
    rows, cid = [], itertools.count()
    for wl, step in (("gpt-tiny", 0.080), ("mlp-wide-with-a-long-name", 0.030)):
        rows.append(dict(cell_id=next(cid), workload=wl, strategy="single", backend="gloo", device="cpu",
                         world_size=1, status="ok", role="reference", precision="fp32", global_batch=8,
                         step_time_median_s=step, throughput_samples_s=8 / step, parity_ok=True))
        for backend, ws, (k, s) in itertools.product(("gloo", "mpi"), (2, 4), enumerate(STRATEGIES)):
            t = step * (0.6 + 0.05 * k) * (1.1 if ws == 4 else 1.0)
            row = dict(cell_id=next(cid), workload=wl, strategy=s, backend=backend, device="cpu", world_size=ws,
                       status="ok", role="independent" if s == "ensemble" else "", precision="fp32", global_batch=8,
                       step_time_median_s=t, throughput_samples_s=8 / t, parity_ok=True, stable=True)
            if s == "dataparallel":
                row.update(status="skipped", reason="needs CUDA: nn.DataParallel drives GPUs of one process " * 2)
            elif backend == "mpi" and s == "tensor":
                row.update(status="failed", reason="RuntimeError: " + "a very long traceback line " * 8)
            elif backend == "mpi" and s == "chain" and ws == 4:
                row.update(status="timeout", reason="no result within cell_timeout_s (600 s)")
            elif s == "layersplit" and ws == 2:
                row.update(stable=False, noise="cv 41%; bimodal steps")
            elif s == "allreduce" and backend == "gloo" and ws == 4:
                row.update(parity_ok=False, parity_rel_err=3e-3)
            rows.append(row)
    rows.append(dict(cell_id=next(cid), workload="gpt-tiny", strategy="tensor", backend="gloo", device="cpu",
                     world_size=8, status="skipped", reason="needs 8 devices, 4 visible"))
    w.append("cells", rows)
    (d / "meta.json").write_text(json.dumps({"run_id": d.name, "config": {}}))
    return d, rows


def text_of(fn, *a, width=100, **kw) -> list[str]:
    console = Console(width=width, record=True, file=io.StringIO())
    fn(*a, console=console, **kw)
    return console.export_text().splitlines()


def test_the_summary_of_99_cells_fits_100_columns(tmp_path):
    run, rows = big_run(tmp_path)
    lines = text_of(print_summary, run)
    assert max(map(len, lines)) <= 100 and len(lines) <= 50, (len(lines), lines)
    head = lines[0]
    n = {s: sum(r["status"] == s for r in rows) for s in ("ok", "failed", "timeout", "skipped")}
    assert len(rows) == 99 and head == (f"parbench run: 99 cells: {n['ok']} ok, {n['failed']} failed, "
                                        f"{n['timeout']} timeout, {n['skipped']} skipped")
    text = "\n".join(lines)
    # the cells that need a look: failures first, then parity, then noise; the rest counted
    look = lines[lines.index(next(x for x in lines if x.startswith("needs a look"))) + 1:][:LOOK_MAX + 1]
    assert "tensor mpi x2: failed: RuntimeError: a very long traceback" in look[0] and look[0].endswith("...")
    assert look[LOOK_MAX].startswith("  ... and ") and "more" in look[LOOK_MAX]
    # the fastest cell per workload, backend and world size: ddp everywhere (ensemble trains other models)
    at = lines.index(next(x for x in lines if x.startswith("the fastest cell per workload")))
    best = [x for x in lines[at + 3:] if x.startswith(("gpt-tiny", "mlp-wide"))]
    assert len(best) == 2 * (2 * 2 + 1)  # per workload: two backends x two sizes, and one device
    assert all(" ddp " in x or " single " in x for x in best), best
    assert "skipped (" in text and "x needs CUDA" in text
    assert f"every cell: parbench report {run}" in text.replace("\n", "")


def test_the_table_of_every_cell_only_when_asked(tmp_path):
    run, _ = big_run(tmp_path)
    lines = text_of(print_summary, run, width=300, table=True)
    assert sum(" ok " in x for x in lines) >= 70


def test_the_recommendation_wraps_to_the_width_and_puts_toys_apart(tmp_path):
    run, _ = big_run(tmp_path)
    lines = text_of(print_recommendation, run)
    assert lines[0].startswith("recommendation: every workload is launch-bound") or lines[0] == "recommendation:"
    assert max(map(len, lines)) <= 100


def test_a_run_ends_with_the_recommendation(tmp_path, monkeypatch, capsys):
    """`parbench run` prints the summary, then the recommendation last; --table adds every cell."""
    from bench.train import launcher

    run, _ = big_run(tmp_path)

    def fake(cfg, gpus, on_progress, resume=None):
        on_progress(NS(kind="plan", n=2, group="", text=""))
        on_progress(NS(kind="group", group="gloo x2", n=2))
        for s in ("ok", "failed"):
            cell = NS(title=f"ddp gpt-tiny gloo x2 ({s})", strategy="ddp", workload=NS(name="gpt-tiny"), n_devices=2)
            on_progress(NS(kind="start", group="gloo x2", cell=cell))
            on_progress(NS(kind="done", group="gloo x2", cell=cell, status=s))
        return run

    monkeypatch.setattr(launcher, "run", fake)
    assert main(["run", "--device", "cpu", "--backends", "gloo", "--out", str(tmp_path / "out")]) == 0
    out, err = capsys.readouterr()
    lines = [x for x in out.splitlines() if x.strip()]
    assert max(map(len, lines)) <= 100 and len(lines) <= 70, len(lines)
    first_rec = next(i for i, x in enumerate(lines) if x.startswith("recommendation"))
    assert lines[0].startswith("parbench run: 99 cells") and first_rec > 5
    assert all(x.startswith(" ") for x in lines[first_rec + 1:]) or "launch-bound workloads" in out
    # no terminal on stderr: one line per group and finished cell, no bar
    assert "\r" not in err and "\x1b[" not in err
    progress = [x for x in err.splitlines() if x.startswith("[")]
    assert progress == ["[0/2  0:00] gloo x2: starting torchrun (2 cells)", "[1/2  0:00] ddp gpt-tiny gloo x2 (ok): ok",
                        "[2/2  0:00] ddp gpt-tiny gloo x2 (failed): failed"]
    assert main(["run", "--device", "cpu", "--backends", "gloo", "--out", str(tmp_path / "out"), "--table"]) == 0
    assert len(capsys.readouterr().out.splitlines()) > 100


def _events(n=3):
    cell = NS(title="ddp mlp gloo x2", strategy="ddp", workload=NS(name="mlp"), n_devices=2)
    return ([NS(kind="plan", n=n, group="", text=""), NS(kind="note", group="", text="plan: 3 cells [x]"),
             NS(kind="group", group="gloo x2", n=n)]
            + [e for _ in range(n) for e in (NS(kind="start", group="gloo x2", cell=cell),
                                               NS(kind="done", group="gloo x2", cell=cell, status="ok"))])


def test_an_adaptive_round_adds_its_cells_to_the_count():
    buf = io.StringIO()
    cell = NS(title="ddp mlp gloo x2", strategy="ddp", workload=NS(name="mlp"), n_devices=2)
    with MatrixProgress(console=Console(file=buf, force_terminal=False, width=100)) as bar:
        more = [NS(kind="note", group="", text="decisions open: 1; round 1 measures 1 cell again"),
                NS(kind="more", group="gloo x2", n=1), NS(kind="group", group="gloo x2", n=1),
                NS(kind="done", group="gloo x2", cell=cell, status="ok")]
        for e in _events(2) + more:
            bar(e)
    assert buf.getvalue().splitlines()[-3:] == ["decisions open: 1; round 1 measures 1 cell again",
                                                "[2/3  0:00] gloo x2: starting torchrun (1 cell)",
                                                "[3/3  0:00] ddp mlp gloo x2: ok"]


@pytest.mark.parametrize("tty", [False, True])
def test_progress_is_lines_in_a_log_and_a_bar_on_a_terminal(tty):
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=tty, width=100)
    with MatrixProgress(console=console) as bar:
        for e in _events():
            bar(e)
    text = buf.getvalue()
    if tty:
        assert "ddp mlp gloo x2: ok" not in text  # a bar, redrawn in place
    else:
        assert text.splitlines() == ["parbench: 3 cells to run", "plan: 3 cells [x]",
                                     "[0/3  0:00] gloo x2: starting torchrun (3 cells)",
                                     "[1/3  0:00] ddp mlp gloo x2: ok", "[2/3  0:00] ddp mlp gloo x2: ok",
                                     "[3/3  0:00] ddp mlp gloo x2: ok"]
        assert "\r" not in text and "\x1b" not in text


def test_no_progress_prints_nothing():
    buf = io.StringIO()
    with MatrixProgress(enabled=False, console=Console(file=buf)) as bar:
        for e in _events():
            bar(e)
    assert buf.getvalue() == ""
