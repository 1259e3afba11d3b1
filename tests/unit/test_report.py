import base64
import json
import re
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
import pytest

from bench.decide.decision import BoundKind, DecisionKind, ExcludedKind
from bench.decide.recommend import first_screen, recommend
from bench.results.run import load_run
from bench.results.store import RunWriter
from reports import build_report, figures, words
from tests import chromium

MAX_W, MAX_H = 1400, 1600  # pixels: no figure taller than about a screen and a half


def fake_run(tmp_path, name="r", slow=1.0):
    w = RunWriter(tmp_path / name)
    cells = [("single", "gloo", 1, 0.1), ("ddp", "gloo", 2, 0.06 * slow), ("ddp", "nccl", 2, 0.055 * slow),
             ("fsdp", "nccl", 2, 0.09), ("ensemble", "nccl", 2, 0.04)]
    for cid, (strategy, backend, ws, t) in enumerate(cells):
        w.add(dict(cell_id=cid, workload="gpt-tiny", strategy=strategy, backend=backend, device="cpu",
                   role={"single": "reference", "ensemble": "independent"}.get(strategy, ""),
                   world_size=ws, status="ok", precision="fp32", global_batch=8, step_time_median_s=t,
                   step_time_ci_low_s=t * 0.99, step_time_ci_high_s=t * 1.01, throughput_samples_s=8 / t,
                   compute_time_s=t * 0.5, comm_time_s=t * 0.4, exposed_comm_s=t * 0.35, idle_frac=0.1,
                   # FSDP's profiled step is 12% off its timed one: drawn with a warning, no bound from it
                   profiled_step_s=t * (1.12 if strategy == "fsdp" else 1.05),
                   breakdown_gap=0.12 if strategy == "fsdp" else 0.05, peak_mem_bytes=2**30 * (3 - ws), repeats=3,
                   ci_basis="repeats (percentile)"),
              [dict(cell_id=cid, repeat=0, rank=0, step=s, phase="timed", step_time_s=t * (1 + s / 100), loss=1.0,
                    loss_weight=1.0) for s in range(5)])
    w.add(dict(cell_id=9, workload="gpt-tiny", strategy="dataparallel", backend="gloo", device="cpu",
               world_size=2, status="skipped", reason="needs CUDA [/x]"))
    (tmp_path / name / "meta.json").write_text(json.dumps({"host": "h", "torch": "x", "run_id": name}))
    return tmp_path / name


def test_throughput_bars_draw_one_bar_per_ok_cell_fastest_first(tmp_path):
    cells, _, _ = load_run(fake_run(tmp_path))
    ax = figures.throughput_bars(cells, "gpt-tiny")
    assert len(ax.patches) == 5
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels[0].startswith("single") and labels[1].startswith("ensemble nccl x2")  # per world size, fastest first
    assert {t.get_text() for t in ax.get_legend().get_texts()} == {"gloo", "nccl"}
    plt.close(ax.figure)


def test_breakdown_stacks_sum_to_the_measured_step(tmp_path):
    cells, _, _ = load_run(fake_run(tmp_path))
    ax = figures.breakdown_bars(cells, "gpt-tiny")
    solid = [p for p in ax.patches if abs(p.get_height() - 0.9) < 1e-9]  # the stacked bars, not the hatched
    ends = {}
    for p in solid:
        y = round(p.get_y(), 3)
        ends[y] = max(ends.get(y, 0), p.get_x() + p.get_width())
    steps = sorted(cells[(cells["status"] == "ok")]["step_time_median_s"] * 1e3)
    assert sorted(round(v, 6) for v in ends.values()) == pytest.approx(sorted(steps), rel=1e-6)
    warned = [t.get_text() for t in ax.get_yticklabels() if "off the timed one" in t.get_text()]
    assert warned == ["fsdp nccl x2 (! profiled step +12.0% off the timed one)"]
    plt.close(ax.figure)


def test_recommendation_matches_the_data(tmp_path):
    cells, _, _ = load_run(fake_run(tmp_path))
    picks = {(p.backend, p.world_size): p for p in recommend(cells)}
    nccl = picks[("nccl", 2)]
    assert nccl.winner == "ddp" and nccl.runner_up == "fsdp"  # the ensemble is left out: other models
    assert nccl.margin == pytest.approx(0.09 / 0.055 - 1) and nccl.significant
    assert ("ensemble", ExcludedKind.INDEPENDENT) in [(e.strategy, e.kind) for e in nccl.excluded]
    assert nccl.speedup == pytest.approx(0.1 / 0.055)
    assert nccl.bounds[0].kind == BoundKind.COMMUNICATION
    fsdp = next(p for p in recommend(cells[cells["strategy"] != "ddp"]) if (p.backend, p.world_size) == ("nccl", 2))
    assert (fsdp.bounds[0].kind, fsdp.bounds[0].value) == (BoundKind.OFF, pytest.approx(0.12))
    assert words.bound_text(fsdp).startswith("bound not known (its profiled step is +12.0% off the timed one)")


def test_report_is_self_contained_and_figures_fit(tmp_path):
    from PIL import Image

    html = build_report(fake_run(tmp_path)).read_text()
    assert "<h1>parbench run <code>" in html
    assert "http://" not in html and "https://" not in html and "<link" not in html
    assert re.search(r"<script[^>]+src=", html) is None
    imgs = re.findall(r'src="data:image/png;base64,([^"]+)"', html)
    assert len(imgs) >= 3
    for data in imgs:
        (tmp_path / "x.png").write_bytes(base64.b64decode(data))
        w, h = Image.open(tmp_path / "x.png").size
        assert w <= MAX_W and h <= MAX_H, (w, h)
    assert "Recommendation" in html and "<b>ddp</b>" in html
    assert "needs CUDA [/x]" in html  # skipped cells in their own section, text verbatim


def test_a_cell_whose_profile_pass_failed_says_so_in_the_table(tmp_path):
    run = fake_run(tmp_path)
    w = RunWriter(run, resume=True)
    w.add(dict(cell_id=7, workload="gpt-tiny", strategy="allreduce", backend="gloo", device="cpu", world_size=2,
               status="ok", precision="fp32", global_batch=8, step_time_median_s=0.07, throughput_samples_s=8 / 0.07,
               profile_at="end", profile_note="profile pass did not finish: no result within cell_timeout_s"),
          [dict(cell_id=7, repeat=0, rank=0, step=0, phase="timed", step_time_s=0.07, loss=1.0, loss_weight=1.0)])
    html = build_report(run, tmp_path / "out").read_text()
    assert "no breakdown: profile pass did not finish: no result within cell_timeout_s" in html


def test_report_with_a_baseline_puts_regressions_first(tmp_path):
    base = fake_run(tmp_path, "base")
    cur = fake_run(tmp_path, "cur", slow=1.3)
    html = build_report(cur, tmp_path / "out", baseline=base).read_text()
    assert "Against" in html and "verdict" in html


def test_report_onto_a_file_is_a_one_line_error(tmp_path):
    from bench.core.errors import UserError

    run = fake_run(tmp_path)
    (tmp_path / "f").write_text("x")
    with pytest.raises(UserError, match="is a file"):
        build_report(run, tmp_path / "f")


needs_chromium = pytest.mark.skipif(chromium.browser() is None,
                                    reason="headless Chromium is not installed (Debian: apt install chromium)")
MAX_PAGE_PX = 15000  # page height at 1400x1000: the committed 61-cell run is ~9,500 px
FIRST_SCREEN_PX = chromium.VIEWPORT[1]
# The recommendation tables as the reader sees them (rows of cell texts) and where the first ends.
PICKS_JS = """(() => { const rows = id => { const t = document.querySelector(id);
    return t ? Array.from(t.rows).slice(1).map(r => Array.from(r.cells).map(c => c.innerText.trim())) : []; };
  const t = document.querySelector('#picks'), h = document.querySelector('h2');
  return {bottom: (t || h).getBoundingClientRect().bottom, rows: rows('#picks'),
          first: h ? h.nextElementSibling.innerText : ''}; })()"""
RUNS = Path(__file__).resolve().parents[1] / "fixtures" / "runs"


def shown_pick(p) -> list[str]:
    """What the recommendation row of ``p`` must read: the answer, whether it is decided and why."""
    use = "no decision" if p.use is None else ("one device" if p.kind == DecisionKind.ONE_DEVICE else p.use)
    decided = "no" if p.use is None else "decided" if p.resolved else \
        "leading, not decided (needs about 3 repeats a cell)"
    name = p.workload + (" launch-bound" if p.launch_bound else "")
    return [name, p.backend, str(p.world_size), use, decided, words.because_text(p)]


def assert_page_ok(page: Path, cells) -> chromium.PageCheck:
    seen = chromium.check_page(page, PICKS_JS)
    assert seen.problems(MAX_PAGE_PX) == [], seen.problems(MAX_PAGE_PX)
    written = sorted(page.parent.glob("*.png"))
    assert len(seen.images) >= len(written) > 0  # every figure beside the page is shown, and loaded
    for img in seen.images:  # pixel size of every figure, as the browser decoded it
        assert 0 < img["w"] <= MAX_W and 0 < img["h"] <= MAX_H, img
    picks = recommend(cells)
    shown = seen.extra
    # every workload in the one table, launch-bound ones marked after the rest
    shown_picks = first_screen([p for p in picks if not p.launch_bound]) + first_screen([p for p in picks
                                                                                         if p.launch_bound])
    assert len(shown["rows"]) == len(shown_picks) and picks
    assert shown["bottom"] <= FIRST_SCREEN_PX  # the answer is on the first screen
    for p, row in zip(shown_picks, shown["rows"]):
        assert row[:6] == shown_pick(p), (row, p)
        assert f"{p.winner} {p.step_ms:.1f} ms/step" in row[6] and words.bound_text(p) in row[6]
        # and the fastest is the fastest qualifying cell of the raw table, not just what recommend() said
        same = cells[(cells["workload"] == p.workload) & (cells["backend"] == p.backend)
                     & (cells["world_size"] == p.world_size) & (cells["status"] == "ok")
                     & (cells["parity_ok"] == True) & (cells["role"] != "independent")]  # noqa: E712
        assert f"fastest: {same.loc[same['step_time_median_s'].idxmin(), 'strategy']} " in row[6]
    return seen


# Click the samples/s header of the table of all cells twice; that column after each click.
SORT_JS = """(() => { const th = Array.from(document.querySelectorAll('#cells th'));
  const i = th.findIndex(h => h.textContent.trim() === 'samples/s');
  const col = () => Array.from(document.querySelectorAll('#cells tbody tr')).map(r => r.cells[i].textContent.trim());
  th[i].click(); const up = col(); th[i].click(); return [up, col()]; })()"""


@needs_chromium
def test_report_in_headless_chromium(tmp_path):
    seen = chromium.check_page(build_report(fake_run(tmp_path)), f"[{PICKS_JS}, {SORT_JS}]")
    assert seen.problems(MAX_PAGE_PX) == []
    seen.extra, (up, down) = seen.extra
    ran = [float(v) for v in up if v]
    assert len(ran) == 5 and ran == sorted(ran) and [float(v) for v in down if v] == sorted(ran, reverse=True)
    rows = {(r[1], r[2]): r for r in seen.extra["rows"]}
    # nccl x2: ddp 55 ms ahead of fsdp 90 ms (+64%), 0.1/0.055 = 1.82x one device, intervals apart
    assert rows[("nccl", "2")][3:6] == ["ddp", "decided", "the library default, +64% ahead of fsdp beyond the noise"]
    assert rows[("nccl", "2")][6].startswith("fastest: ddp 55.0 ms/step, 1.82x one device; +64% ahead of fsdp "
                                             "(beyond the noise)\ncommunication-bound")
    assert "ensemble: trains independent models" in rows[("nccl", "2")][6]
    assert rows[("gloo", "2")][3:6] == ["ddp", "decided", "the only strategy that passed"]
    assert rows[("gloo", "2")][6].startswith("fastest: ddp 60.0 ms/step, 1.67x one device\n")
    assert seen.extra["bottom"] <= FIRST_SCREEN_PX
    for img in seen.images:
        assert 0 < img["w"] <= MAX_W and 0 < img["h"] <= MAX_H, img


@needs_chromium
@pytest.mark.parametrize("run", ["two-gpus-h100", "four-gpus-h100", "check-h100-x4"])
def test_committed_gpu_report_in_headless_chromium(run, tmp_path):
    """The report of a recorded H100 run: no console errors, no requests, height bounded, every
    figure loaded and within size, the recommendation on the first screen and matching the data."""
    cells, _, _ = load_run(RUNS / run)
    assert_page_ok(build_report(RUNS / run, tmp_path / "report"), cells[cells["mode"] != "serve"]
                   if "mode" in cells else cells)


BROKEN = {
    "console.error": '<script>console.error("boom")</script>',
    "uncaught": "<script>setTimeout(() => notDefinedAnywhere(), 0)</script>",
    "thrown at load": '<script>throw new Error("at load")</script>',
    "network": '<img src="http://192.0.2.1/pixel.png" alt="external">',
    "fetch": '<script>fetch("https://example.invalid/x").catch(() => {})</script>',
    "height": '<div style="height:40000px"></div>',
}


@pytest.fixture(scope="module")
def good_page(tmp_path_factory):
    return build_report(fake_run(tmp_path_factory.mktemp("good")))  # passes: test_report_in_headless_chromium


@needs_chromium
@pytest.mark.parametrize("kind", sorted(BROKEN))
def test_the_browser_check_catches_a_broken_page(kind, good_page, tmp_path):
    """The checks above can fail: a copy of a good report with one fault injected is caught."""
    page = good_page
    bad = tmp_path / "broken.html"
    bad.write_text(page.read_text().replace("</body>", BROKEN[kind] + "</body>"))
    problems = " | ".join(chromium.check_page(bad).problems(MAX_PAGE_PX))
    expect = {"console.error": "console.error: boom", "uncaught": "uncaught: ReferenceError: notDefinedAnywhere",
              "thrown at load": "uncaught: Error: at load", "network": "network request: http://192.0.2.1/pixel.png",
              "fetch": "network request: https://example.invalid/x", "height": "px tall"}[kind]
    assert expect in problems, problems


@pytest.mark.parametrize("run", ["two-gpus-h100", "four-gpus-h100"])
def test_breakdown_adds_up_on_the_committed_gpu_runs(run):
    """On real H100 runs: the stacked parts of every drawn cell sum to its timed median, and a cell
    whose profiled step is more than 5% off says so in its label."""
    cells, _, _ = load_run(RUNS / run)
    ax = figures.breakdown_bars(cells, "gpt-200m")
    ends = {}
    for p in ax.patches:
        if abs(p.get_height() - 0.9) < 1e-9:
            y = round(p.get_y(), 3)
            ends[y] = max(ends.get(y, 0), p.get_x() + p.get_width())
    labels = [t.get_text() for t in ax.get_yticklabels()]
    drawn = cells[(cells["status"] == "ok") & cells["compute_time_s"].notna()].sort_values("step_time_median_s")
    assert len(ends) == len(drawn) == len(labels) > 5
    assert sorted(ends.values()) == pytest.approx(sorted(drawn["step_time_median_s"] * 1e3), rel=1e-6)
    assert any("profiled step" in lab for lab in labels)  # the profiler's own cost is shown, not hidden
    plt.close(ax.figure)


def test_a_cell_without_a_breakdown_claims_no_bound():
    """With no profiled steps (--profile-steps 0, or a profile pass that failed or was cut) the
    recommendation said 'compute-bound' by default: a claim nothing measured."""
    import pandas as pd

    from reports.words import why as reason

    measured = pd.Series({"compute_time_s": 0.05, "exposed_comm_s": 0.001, "idle_frac": 0.01, "mfu": 0.4})
    assert reason(measured).startswith("compute-bound (MFU 40%)")
    assert reason(pd.Series({"mfu": 0.4})) == "bound not known (no breakdown)"
    note = pd.Series({"profile_note": "profile pass not run: the time budget's deadline passed"})
    assert reason(note) == "bound not known (no breakdown: profile pass not run: the time budget's deadline passed)"


def _with_calls(run):
    """The fake run with recorded calls: three one-rank all_reduces of the single-device cell (no-ops,
    far below any curve) and two two-rank ones of ddp gloo x2, and a flat sweep of this machine."""
    import pandas as pd

    mib = 2.0**20
    one = [dict(cell_id=0, rank=0, backend="gloo", world_size=1, op="allreduce", group_size=None, bytes=64 * mib,
                start_s=float(i), duration_s=1.0) for i in range(3)]
    two = [dict(cell_id=1, rank=k, backend="gloo", world_size=2, op="allreduce", group_size=2, bytes=64 * mib,
                start_s=float(i), duration_s=64 * mib / 10e9) for i in range(2) for k in range(2)]
    RunWriter(run, resume=True).append("comm", one + two)
    pd.DataFrame([{"kind": "sweep", "status": "ok", "op": "all_reduce", "backend": "gloo", "device": "cpu",
                   "world_size": n, "dtype": "fp32", "bytes": s, "busbw_gbs": 10.0, "time_s": 1e-3}
                  for n in (1, 2) for s in (2**20, 2**30)]).to_parquet(run / "collectives.parquet")
    return run


def test_one_rank_calls_are_not_collectives(tmp_path):
    """A call of one rank moves nothing: it is neither drawn as a collective nor counted in the
    report's note on collectives below the machine's curve."""
    from bench.comm.model import annotate_comm
    from bench.results.store import read_table
    from reports import html

    run = _with_calls(fake_run(tmp_path))
    everything = annotate_comm(read_table(run, "comm"), read_table(run, "collectives"))
    ax = figures.collective_bandwidth(everything)
    assert sum(len(c.get_offsets()) for c in ax.collections) == 4  # the two-rank calls of both ranks only
    assert "1 ranks" not in " ".join(t.get_text() for t in ax.get_legend().get_texts())
    plt.close(ax.figure)
    annotated = html._annotated_comm(run, {})
    assert set(annotated["cell_id"]) == {1}
    page = build_report(run, tmp_path / "out").read_text()
    assert "single gloo x1: 3 of 3 recorded collectives" not in page
    assert "collectives.png" in " ".join(p.name for p in (tmp_path / "out").glob("*.png"))


def serve_run(tmp_path, *, target_ms: float | None = 50.0, name="serve"):
    """A `parbench serve` run of two devices: replicas under two policies and a pipeline at two load
    levels, a rate sweep of replicas/jsq, and a pinned-tenants pool that failed to start."""
    from bench.core.metrics import registry
    from bench.results.store import cell_columns
    from bench.serve import schema

    w = RunWriter(tmp_path / name, cell_schema=cell_columns(registry(schema.SERVE_METRICS)), tables=schema.TABLES)
    slo = None if target_ms is None else target_ms / 1e3
    rows = []
    # (placement, policy, scenario, load, offered, achieved, p99 ms)
    for k, (pl, pol, scen, load, rate, got, p99) in enumerate([
            ("replicas", "rr", "levels", "poisson@50/s", 50, 49.0, 30.0),
            ("replicas", "rr", "levels", "poisson@100/s", 100, 97.0, 80.0),
            ("replicas", "jsq", "levels", "poisson@50/s", 50, 49.5, 20.0),
            ("replicas", "jsq", "levels", "poisson@100/s", 100, 98.0, 40.0),
            ("pipeline", "-", "levels", "poisson@50/s", 50, 49.0, 60.0),
            ("pipeline", "-", "levels", "poisson@100/s", 100, 60.0, 900.0),
            ("replicas", "jsq", "sweep", "poisson@150/s", 150, 146.0, 48.0),
            ("replicas", "jsq", "sweep", "poisson@200/s", 200, 150.0, 400.0)]):
        rows.append(dict(cell_id=k + 1, workload="mlp", strategy=pl, backend="mp-queue", device="cpu", world_size=2,
                         status="ok", role="independent", precision="fp32", mode="serve", serve_policy=pol,
                         serve_load=load, serve_scenario=scen, serve_task="classify", serve_offered_rps=float(rate),
                         serve_achieved_rps=got, latency_p50_s=p99 / 2e3, latency_p99_s=p99 / 1e3, latency_n=1000,
                         util_mean=0.5, util_imbalance=1.1, parity_rel_err=0.0, stable=True, slo_s=slo,
                         slo_met=None if slo is None else p99 / 1e3 <= slo and got >= 0.9 * rate))
    rows.append(dict(cell_id=9, workload="mlp", strategy="pinned-tenants", backend="mp-queue", device="cpu",
                     world_size=2, status="failed", reason="RuntimeError: pool did not start", role="independent",
                     precision="fp32", mode="serve", serve_policy="pinned", serve_load="poisson@50/s",
                     serve_scenario="levels", serve_task="classify", slo_s=slo))
    w.append("cells", rows)
    (tmp_path / name / "meta.json").write_text(json.dumps({"host": "h", "torch": "x", "run_id": name, "mode": "serve"}))
    return tmp_path / name


def test_the_report_of_a_serve_run_is_about_serving(tmp_path):
    """Its tables are HTML tables, the training sections are gone, and its answer is the placement
    and policy with the highest rate that met the p99 target."""
    page = build_report(serve_run(tmp_path)).read_text()
    assert "<h1>parbench serve <code>" in page
    assert "<pre>" not in page and "| placement |" not in page
    assert "<h2>Recommendation</h2>" not in page and "<h2>All cells</h2>" not in page
    assert "No strategy on more than one device passed" not in page
    serve_picks = re.search(r"<table class=\"pick\" id=\"serve-picks\">(.*?)</table>", page, re.S).group(1)
    assert "<b>replicas/jsq</b>" in serve_picks and "146.0" in serve_picks  # the sweep's passing rate
    assert "next: replicas/rr at 49.0 req/s" in serve_picks and "never met it: pipeline" in serve_picks
    levels = re.findall(r"<table class=\"serve\">(.*?)</table>", page, re.S)
    assert len(levels) == 2  # the load levels and the sweep
    assert re.search(r"<td class=\"l\">replicas</td><td class=\"l\">jsq</td><td class=\"l\">poisson@100/s</td>"
                     r"<td class=\"\">98.0</td>", levels[0])
    assert "failed: RuntimeError: pool did not start" in levels[0]
    # the failed pool is where the page lists what did not run, not "None"
    failed = page[page.index("<h2>Failed and skipped cells</h2>"):]
    assert "pinned-tenants" in failed and "RuntimeError: pool did not start" in failed
    assert "1 failed or timed out" in page and "8 cells ok" in page


@pytest.mark.parametrize("target_ms, why", [
    (None, "no latency target was set (parbench serve --slo-ms MS picks what meets it); the highest rate answered "
           "was replicas/jsq at 150.0 req/s (p99 400.0 ms)"),
    (10.0, "no placement and policy met the p99 target of 10 ms at any rate tried; the lowest p99 was 20.0 ms "
           "(replicas/jsq)")])
def test_a_serve_run_without_an_answer_says_why(tmp_path, target_ms, why):
    from reports.serving import serve_picks

    cells, _, _ = load_run(serve_run(tmp_path, target_ms=target_ms))
    (p,) = serve_picks(cells)
    assert p.use is None and p.because == why, p


@needs_chromium
def test_serve_report_in_headless_chromium(tmp_path):
    seen = chromium.check_page(build_report(serve_run(tmp_path)))
    assert seen.problems(MAX_PAGE_PX) == []


def test_an_off_bar_names_a_build_that_ran_off_before_profiling():
    import pandas as pd

    r = pd.Series({"step_time_median_s": 0.075, "unprofiled_step_s": 0.088, "profile_builds": 2.0})
    assert figures.off_label(r, 0.30) == " (! profiled step +30% off the timed one; its build +17.3% off unprofiled)"
    assert figures.off_label(r.replace(0.088, 0.077), 0.30) == " (! profiled step +30% off the timed one)"


def test_figure_labels_do_not_repeat_what_the_strategy_name_says():
    from reports.figures import cell_label

    assert cell_label({"strategy": "pipeline-interleaved", "schedule": "interleaved-1f1b", "backend": "gloo",
                       "world_size": 2}) == "pipeline-interleaved gloo x2"
    assert cell_label({"strategy": "pipeline-1f1b", "schedule": "1f1b", "backend": "nccl", "world_size": 4}) == \
        "pipeline-1f1b nccl x4"
    assert cell_label({"strategy": "dp-pp", "mesh": "2x2", "schedule": "gpipe", "backend": "nccl",
                       "world_size": 4}) == "dp-pp 2x2 gpipe nccl x4"


def test_the_scaling_figure_marks_efficiencies_that_are_not_physical():
    """An efficiency of 16 on an axis labelled '1 = ideal' read as a result: the axis stops past the
    physical limit, the band above it is shaded and the points beyond are marked, with their top."""
    from reports.figures import scaling_lines

    cells = pd.DataFrame({"workload": ["w"] * 4, "strategy": ["single", "ddp", "ddp", "fsdp"],
                          "backend": ["gloo"] * 4, "world_size": [1, 2, 4, 2], "status": ["ok"] * 4,
                          "scaling_efficiency": [1.0, 0.9, 16.0, 1.2], "scaling": ["strong"] * 4})
    ax = scaling_lines(cells, "w")
    assert ax.get_ylim()[1] < 2
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "> 1.05: not physical" in labels and "off the axis (up to 16.0)" in labels
