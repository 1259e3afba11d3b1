"""The HTML report: one self-contained page that answers which strategy, why, at what cost, and
what changed.

The first screen is the recommendation (``bench.decide.recommend``, in :mod:`reports.words`' words)
per workload, backend and world size: what to use or that there is no decision, whether it is
decided, why, what was measured and what to try next; launch-bound (toy) workloads have their own
section further down. Then, per workload, figures sized to their content (embedded as base64 PNG,
also written beside the page for slides); the comparison with a baseline run or a history when
asked (regressions first, judged as ``parbench compare`` judges them); skipped and failed cells in
their own section; a sortable table of every cell. A serving run gets its own answer and its tables
(:mod:`reports.serving`) instead of the training sections. No script or style is fetched from
anywhere: the page opens offline."""

from __future__ import annotations

import base64
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import jinja2
import matplotlib
import pandas as pd

from bench.comm.model import annotate_comm, find_sweep
from bench.core.errors import UserError
from bench.core.paths import folder_problem
from bench.decide import picks
from bench.decide.decision import Decision
from bench.decide.recommend import is_false, is_reference
from bench.gate import history as hist
from bench.gate.ciout import SHIFT_LEGEND, verdict_rows
from bench.gate.verdict import Gate, judge
from bench.results.bounds import safe_name
from bench.results.columns import lookup, shown
from bench.results.run import Run, load_run
from bench.results.store import CELL_COLUMNS, SAMPLE_COLUMNS, frame, read_table
from bench.runtime.signals import defer_stops
from reports import figures, words
from reports.figures import cell_label
from reports.memory import memory_table
from reports.search import section as search_section
from reports.serving import serve_section

TEMPLATE = """<!doctype html>
<html><head><meta charset="utf-8"><title>parbench {{ meta.run_id }}</title>
<style>
body{font-family:system-ui,sans-serif;margin:1.5em;max-width:1200px;color:#222}
h1{font-size:1.4em;margin:.2em 0}h2{font-size:1.15em;margin-top:1.6em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:12px}td,th{border:1px solid #ccc;padding:2px 5px;text-align:right}
th{background:#f0f0f0}#cells th{cursor:pointer}td.l,th.l{text-align:left}.n{white-space:nowrap}.bad{background:#fdd}.warn{background:#fff4d6}
.pick{font-size:14px}.pick td{padding:4px 8px}.muted{color:#777;font-size:12px}
img{max-width:100%;border:1px solid #eee;margin:4px 0;display:block}code{background:#f6f6f6}
.wide{overflow-x:auto;max-width:100%}#cells td{white-space:nowrap}#cells td.reason{white-space:normal;min-width:30em}details.flags{font-size:13px;background:#fff4d6;padding:3px 8px;margin:6px 0}
details.flags li{margin:2px 0}details.flags summary{cursor:pointer}
</style></head><body>
<h1>parbench {{ 'serve' if meta.mode == 'serve' else 'run' }} <code>{{ meta.run_id }}</code></h1>
<p class="muted">{{ meta.created_utc }} &middot; host <code>{{ meta.host }}</code> &middot; torch {{ meta.torch }}
{% if meta.nccl %}&middot; NCCL {{ meta.nccl }}{% endif %}{% if gpus %} &middot; {{ gpus }}{% endif %}
{% if meta.git_commit %}&middot; commit <code>{{ meta.git_commit }}</code>{% endif %} &middot; {{ n_ok }} cells ok, {{ n_bad }} failed or timed out,
{{ n_skipped }} skipped{% if meta.plan %} &middot; {{ meta.plan }}{% endif %}</p>
{% macro pick_table(id, rows) %}<table class="pick" id="{{ id }}"><tr><th class="l">workload</th><th class="l">backend</th><th>devices</th>
<th class="l">use</th><th class="l">decided?</th><th class="l">because</th><th class="l">measured</th><th class="l">try next</th></tr>
{% for p in rows %}<tr class="{{ 'warn' if p.use is none else '' }}"><td class="l n">{{ p.workload }}{% if a.training_text(p) %} ({{ a.training_text(p) }}){% endif %}{% if p.launch_bound %} <span class="muted">launch-bound</span>{% endif %}</td><td class="l n">{{ p.backend }}</td><td>{{ p.world_size }}</td>
<td class="l n"><b>{{ a.use_text(p) }}</b></td><td class="l">{{ a.decided_text(p) }}</td><td class="l">{{ a.because_text(p) }}</td>
<td class="l">{{ a.measured_text(p) }}<br><span class="muted">{{ a.bound_text(p) }}{% if p.excluded and p.ground != 'none-passed' %}; left out: {{ a.excluded_text(p) }}{% endif %}</span></td>
<td class="l">{{ a.next_text(p) or "-" }}</td></tr>
{% endfor %}</table>{% endmacro %}
{% if training %}<h2>Recommendation</h2>
{% if picks or toys %}{{ pick_table("picks", picks + toys) }}
{% if toys %}<p class="muted">Launch-bound: for these workloads {{ a.LAUNCH_BOUND_WHY }}.</p>{% endif %}
<p class="muted">Decided: every pair the answer rests on (the fastest against one device, and against the library
default or the runner-up) is either separated beyond the noise or within 3% of each other, on intervals from at
least three repeats, and nothing blocks it (a contended cell, an unstable one measured once, an efficiency that is
not physical); leading, not decided: the answer stands until the repeats it names separate the pair.
Candidates: cells that ran (status ok, which includes the check that the work was really distributed) and
matched one device (parity ok); independent models (ensemble) are left out.</p>
{% elif search and search.answers and not multi %}<p>One device measured: the search's configuration to use below is the answer.</p>
{% else %}<p>No strategy on more than one device passed; see the failed and skipped cells below.</p>{% endif %}{% endif %}
{% if search %}<h2>Configuration to use (knob search)</h2>
{% for lines in search.answers %}<p>{% for l in lines %}{% if loop.first %}<b>{{ l }}</b>{% else %}<br>{{ l }}{% endif %}{% endfor %}</p>{% endfor %}
<p class="muted">{{ search.summary }}. Searched: {{ search.knobs|join("; ") }}. Configurations are ranked by samples a second
(their batches differ); a margin is judged beyond the noise only on intervals from at least three repeats.
The first configuration's settings are in best.toml in the run folder: <code>parbench run --config RUN/best.toml</code> measures it again.</p>
{% if search.stages %}<p class="muted">{{ search.stages|join("; ") }}</p>{% endif %}
{% if search.estimates %}<h3>Estimates at more GPUs of this kind (not measured)</h3>
<table class="pick" id="estimates"><tr><th class="l">strategy</th><th>GPUs</th><th>ms/step</th><th>speed-up</th><th>comm ms</th></tr>
{% for e in search.estimates %}<tr>{% for v in e %}<td class="{{ 'l' if loop.first else '' }}">{{ v }}</td>{% endfor %}</tr>{% endfor %}</table>
<p class="muted">For {{ search.estimate_of }}'s best configuration; assumes {{ search.assumes }}.</p>{% endif %}
{% if search.pruned %}<details><summary>{{ search.pruned|length + search.more_pruned }} candidates not measured, and why</summary>
<table class="pick"><tr><th class="l">configuration</th><th>devices</th><th class="l">why</th></tr>
{% for c, ws, why in search.pruned %}<tr><td class="l">{{ c }}</td><td>{{ ws }}</td><td class="l">{{ why }}</td></tr>{% endfor %}</table>
{% if search.more_pruned %}<p class="muted">and {{ search.more_pruned }} more (meta.json, search.pruned).</p>{% endif %}</details>{% endif %}{% endif %}
{% if serve %}<h2>Serving: what to serve with</h2><table class="pick" id="serve-picks"><tr><th class="l">workload</th><th>devices</th>
<th class="l">serve with</th><th>req/s</th><th>p99 ms</th><th>target ms</th><th class="l">because</th></tr>
{% for p in serve.picks %}<tr class="{{ 'warn' if p.use is none else '' }}"><td class="l n">{{ p.workload }}</td><td>{{ p.world_size }}</td>
<td class="l n"><b>{{ p.use or "no decision" }}</b></td><td>{{ "%.1f"|format(p.rate_rps) if p.rate_rps is not none else "-" }}</td>
<td>{{ "%.1f"|format(p.p99_ms) if p.p99_ms is not none else "-" }}</td><td>{{ "%g"|format(p.target_ms) if p.target_ms is not none else "-" }}</td>
<td class="l">{{ p.because }}</td></tr>{% endfor %}</table>
<p class="muted">Of the serving cells that ran and matched one device, the placement and policy with the highest
achieved rate whose p99 met the target (p99 reported, the rate kept up with, the backlog steady).</p>{% endif %}
{% if comparison %}<h2>Against {{ comparison.base }}</h2>{{ comparison.html|safe }}{% endif %}
{% if serve %}<h2>Serving</h2><p class="muted">One model per device serving requests (parbench serve): per
placement, policy and load level the achieved rate and the latency percentiles that have enough samples
(LoadGen's rule); parity of every replica against one device.</p>
{% for t in serve.tables %}<h3>{{ t.title }}</h3><div class="wide"><table class="serve"><tr>{% for h in t.head %}<th class="{{ '' if h in t.numeric else 'l' }}">{{ h }}</th>{% endfor %}</tr>
{% for r in t.rows %}<tr>{% for v in r %}<td class="{{ '' if t.head[loop.index0] in t.numeric else 'l' }}">{{ v }}</td>{% endfor %}</tr>
{% endfor %}</table></div>{% endfor %}
{% for img in serve.images %}<img src="data:image/png;base64,{{ img.data }}" alt="{{ img.name }}">{% endfor %}{% endif %}
{% for wl in workloads %}
<h2>{{ wl.name }}</h2><p class="muted">{{ wl.description }}</p>
{% if wl.flags %}<details class="flags"><summary>{{ wl.flags|length }} cell{{ "s" if wl.flags|length > 1 else "" }}: recorded
collectives ran below half of this machine's bandwidth curve (click for each)</summary><ul>
{% for f in wl.flags %}<li>{{ f }}</li>{% endfor %}</ul></details>{% endif %}
{% for img in wl.images %}<img src="data:image/png;base64,{{ img.data }}" alt="{{ img.name }}" title="{{ img.name }}">
{% endfor %}{% if wl.memory %}<p class="muted">{{ a.memory_caption(wl.memory_cpu) }}</p>
<table class="memory"><tr>{% for h in wl.memory.head %}<th class="{{ '' if h in wl.memory.numeric else 'l' }}">{{ h }}</th>{% endfor %}</tr>
{% for r in wl.memory.rows %}<tr>{% for v in r %}<td class="{{ '' if wl.memory.head[loop.index0] in wl.memory.numeric else 'l' }}">{{ v }}</td>{% endfor %}</tr>
{% endfor %}</table>{% endif %}{% endfor %}
{% if telemetry %}<h2>Telemetry per cell</h2>{% for img in telemetry %}
<img src="data:image/png;base64,{{ img.data }}" alt="{{ img.name }}">{% endfor %}{% endif %}
{% if meta.telemetry %}<p class="muted">Telemetry notes: {% for k, v in meta.telemetry.items() %}<code>{{ k }}</code>:
{{ v }}; {% endfor %}</p>{% endif %}
<h2>Failed and skipped cells</h2>
{% if not_run %}<table><tr><th class="l">workload</th><th class="l">strategy</th><th class="l">backend</th><th>ws</th><th class="l">status</th><th class="l">reason</th></tr>
{% for r in not_run %}<tr class="{{ 'bad' if r.status != 'skipped' else '' }}"><td class="l">{{ r.workload }}</td>
<td class="l">{{ r.strategy }}</td><td class="l">{{ r.backend }}</td><td>{{ r.world_size }}</td><td class="l">{{ r.status }}</td>
<td class="l">{{ r.reason }}</td></tr>{% endfor %}</table>{% else %}<p>None.</p>{% endif %}
{% if training %}<p class="muted">Blank energy: the timed window was under 1 s (NVML's energy counter moves in ~12 J steps) or
no NVML. Blank MFU: a GPU without a known peak. Blank parity: the cell did not run, or trains its own models.</p>{% endif %}
{% if training %}<h2>All cells</h2><p class="muted">Click a header to sort.</p>
<div class="wide"><table id="cells"><thead><tr>{% for c in columns %}<th class="{{ 'l' if loop.index <= 5 or loop.last else '' }}">{{ c }}</th>{% endfor %}</tr></thead><tbody>
{% for r in rows %}<tr class="{{ r.cls }}">{% for v in r.vals %}
<td class="{{ 'l' if loop.index <= 5 else ('l reason' if loop.last else '') }}">{{ v }}</td>{% endfor %}</tr>
{% endfor %}</tbody></table></div>{% endif %}
<script>
document.querySelectorAll("#cells th").forEach((th, i) => th.addEventListener("click", () => {
  const body = document.querySelector("#cells tbody"), rows = Array.from(body.rows);
  const dir = th.dataset.dir === "1" ? -1 : 1; th.dataset.dir = dir === 1 ? "1" : "-1";
  const key = r => { const t = r.cells[i].textContent.trim(), n = parseFloat(t); return isNaN(n) ? t : n; };
  rows.sort((a, b) => { const x = key(a), y = key(b);
    return (typeof x === typeof y ? (x > y) - (x < y) : (typeof x === "number" ? -1 : 1)) * dir; });
  rows.forEach(r => body.appendChild(r));
}));
</script>
</body></html>
"""


def table_columns(columns) -> list:
    """The table's columns: keys and status, the registry's report metrics, then the reason."""

    head = [lookup(c) for c in ("workload", "strategy", "backend", "world_size", "status")]
    body = [m for m in shown("report", columns) if m.name not in {h.name for h in head}]
    return head + body + [lookup("reason")]


def _gpus(gpus) -> str:
    """'4 x NVIDIA H100 80GB HBM3' for four alike; names in order of first appearance."""
    if not gpus:
        return ""
    names = list(dict.fromkeys(map(str, gpus)))
    return ", ".join(f"{list(map(str, gpus)).count(n)} x {n}" for n in names)


def _figure(fn, out: Path, name: str) -> list[dict]:
    """Draw, write NAME.png beside the page, return it for embedding (a one-item list). A figure the
    run's values cannot be drawn from is left out with a warning: the page stands without it."""
    try:
        ax = fn()
        path = out / f"{name}.png"
        figures.save(ax, path)
    except OSError:
        raise
    except Exception as e:  # noqa: BLE001 - values of a run from another tool; the table still has them
        logging.getLogger("parbench").warning("figure %s left out: %s: %s", name, type(e).__name__,
                                              " ".join(str(e).split())[:120])
        figures.plt.close("all")
        return []
    return [_embedded(path)]


def _embedded(path: Path) -> dict:
    """A PNG written beside the page, as the page embeds it (base64)."""
    return {"name": path.stem, "data": base64.b64encode(path.read_bytes()).decode()}


def _workload_figures(cells: pd.DataFrame, wl: str, out: Path, annotated: pd.DataFrame | None) -> list[dict]:
    ok = cells[(cells["workload"] == wl) & (cells["status"] == "ok")]
    if ok.empty:
        return []
    kinds = [("throughput", lambda: figures.throughput_bars(cells, wl))]
    multi = ok[~is_reference(ok)]
    if multi["scaling_efficiency"].notna().any() and ok["world_size"].nunique() > 1:
        kinds.append(("scaling", lambda: figures.scaling_lines(cells, wl)))
    if "compute_time_s" in ok and ok["compute_time_s"].notna().any():
        kinds.append(("breakdown", lambda: figures.breakdown_bars(cells, wl)))
    if ok["peak_mem_bytes"].notna().any():
        kinds.append(("pareto", lambda: figures.pareto(cells, wl)))
    if "energy_per_sample_j" in ok and ok["energy_per_sample_j"].notna().any():
        kinds.append(("energy", lambda: figures.energy_bars(cells, wl)))
    if len(figures.memory_cells(cells, wl)):
        kinds.append(("memory", lambda: figures.memory_bars(cells, wl)))
    if annotated is not None and len(annotated):
        ids = set(ok["cell_id"])
        mine = annotated[annotated["cell_id"].isin(ids)]
        if len(mine):
            kinds.append(("collectives", lambda: figures.collective_bandwidth(mine)))
    return [img for kind, fn in kinds for img in _figure(fn, out, f"{safe_name(wl)}-{kind}")]


def _comm_flags(cells: pd.DataFrame, wl: str, annotated: pd.DataFrame | None) -> list[str]:
    """Cells whose recorded collectives ran far below the machine's curve, and whether waiting for
    a slower peer explains it (the record includes the wait; the fastest rank's copy shows the link)."""
    if annotated is None or not len(annotated) or "below_curve" not in annotated:
        return []

    out = []
    ok = cells[(cells["workload"] == wl) & (cells["status"] == "ok")]
    for _, r in ok.iterrows():
        a = annotated[annotated["cell_id"] == r["cell_id"]]
        below = a[a["below_curve"] == True]  # noqa: E712 - may hold NA
        if len(a) and len(below) / len(a) > 0.25:
            waits = int((below.get("wait_explains", pd.Series(dtype=bool)) == True).sum())  # noqa: E712
            out.append(f"{cell_label(r)}: {len(below)} of {len(a)} recorded collectives ran below half of this "
                       f"machine's bandwidth curve (median {a['ratio'].median():.2f} of it); "
                       + (f"{waits} of them are explained by waiting for a slower peer (the fastest rank's copy "
                          "was on the curve)" if waits else "waiting for a peer does not explain them"))
    return out


def _annotated_comm(run_dir: Path, meta: dict) -> pd.DataFrame | None:
    """The run's recorded collectives against a sweep of the same machine, when one is at hand
    (in the run folder, or a stored sweep of the same fingerprint under the results folder)."""
    comm_path = run_dir / "comm.parquet"
    if not comm_path.exists():
        return None
    try:

        # through read_table: the bounds and types of bench.results.bounds hold here too
        found = run_dir / "collectives.parquet" if (run_dir / "collectives.parquet").exists() else \
            find_sweep(run_dir.parent, meta)
        if found is None:
            return None
        calls = figures.collectives(read_table(run_dir, "comm"))  # one rank's calls move nothing
        return annotate_comm(calls, read_table(found.parent, "collectives")) if len(calls) else None
    except Exception:  # noqa: BLE001 - the annotation is extra; the report stands without it
        return None


#: the hidden folder a report is drawn into before its files replace the previous report's
STAGE = ".parbench-report.partial"


def build_report(run_dir: Run | Path, out: Path | None = None, *, baseline: Path | None = None,
                 history: Path | None = None, threshold: float | None = None,
                 decisions: list[Decision] | None = None) -> Path:
    """Write ``index.html`` (self-contained) and its PNG figures into ``out`` (default
    RUN_DIR/report); returns the HTML path. ``baseline`` (a run) or ``history`` (a store) adds the
    comparison, regressions first, judged at ``threshold`` (a fraction; default ``parbench
    compare``'s). The report is drawn into a hidden folder inside ``out`` and moved
    into place when whole, ``index.html`` last: a report stopped at any moment leaves the previous
    ``index.html`` as it was. ``decisions``: the run's (:mod:`bench.decide.picks`), when the caller
    holds them."""
    run = load_run(run_dir)
    run_dir = Path(run.path)
    out = Path(out) if out else run_dir / "report"
    why = folder_problem(out)
    if why == "it is a file":
        raise UserError(f"report output {out} is a file; pass a folder with -o")
    if why:
        raise UserError(f"report output {str(out)!r} cannot be written ({why}); pass a writable folder with -o")
    stage = out / STAGE
    try:
        shutil.rmtree(stage, ignore_errors=True)  # left by a report that was killed
        stage.mkdir()
        logging.getLogger("parbench").info("drawing the report of %s in %s", run_dir, stage)
        # Every string on a figure comes from the run: plain text, never mathtext ("$" in a name).
        with matplotlib.rc_context({"text.parse_math": False}):
            html = _render(run, stage, Against(baseline, history, threshold),
                           decisions if decisions is not None else picks.of(run))
        (stage / "index.html").write_text(html)
        defer_stops(True)  # a stop while the files move is raised once they are all in place
        _publish(stage, out)
    except OSError as e:
        raise UserError(f"report output {str(out)!r} cannot be written ({e.strerror or e}); free space or pass "
                        "another folder with -o") from None
    finally:
        defer_stops(False)
        shutil.rmtree(stage, ignore_errors=True)
    return out / "index.html"


def _publish(stage: Path, out: Path) -> None:
    """Move every file of ``stage`` to the same place under ``out``, ``index.html`` last."""
    files = sorted((p for p in stage.rglob("*") if p.is_file()), key=lambda p: p.name == "index.html")
    for f in files:
        dest = out / f.relative_to(stage)
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.replace(f, dest)


@dataclass(frozen=True)
class Against:
    """What the report compares the run with: a baseline run, or a history store, at ``threshold``
    (None: parbench compare's)."""

    baseline: Path | None = None
    history: Path | None = None
    threshold: float | None = None


def _render(run: Run, out: Path, against: Against, decisions: list[Decision]) -> str:
    """The page, its figures written into ``out`` as it goes. A run of serving cells only has no
    training sections (recommendation, figures, the table of cells): its own answer and tables."""
    run_dir, meta = Path(run.path), run.meta
    # first: a pair with nothing comparable is compare's one-line error, before any figure is drawn
    comparison = _comparison(run, against, out)
    everything = frame(run.cells, CELL_COLUMNS)  # every core column, empty where a run from another tool lacks it
    serving = everything[everything["mode"] == "serve"]
    cells = everything.drop(serving.index)  # training cells: figures and the recommendation are about steps
    described = meta.get("workloads") or {}
    annotated = _annotated_comm(run_dir, meta)
    wls = [{"name": wl, "description": described.get(wl, ""), "flags": _comm_flags(cells, wl, annotated),
            "images": _workload_figures(cells, wl, out, annotated), "memory": memory_table(cells, wl),
            "memory_cpu": not cells.loc[cells["workload"] == wl, "peak_mem_bytes"].notna().any()}
           for wl in cells["workload"].dropna().unique()]
    real, toys = words.split(decisions)
    cols = table_columns(cells.columns)
    not_run = everything[everything["status"] != "ok"].sort_values(["status", "workload", "strategy"])
    return jinja2.Environment(autoescape=True).from_string(TEMPLATE).render(
        meta={"run_id": run_dir.name, **meta}, gpus=_gpus(meta.get("gpus")), a=words, training=len(cells) > 0,
        picks=real, toys=toys, workloads=wls, telemetry=_telemetry(run, cells, out),
        columns=[m.title for m in cols], rows=_cell_rows(cells, cols), not_run=[r for _, r in not_run.iterrows()],
        comparison=comparison, search=search_section(run), multi=bool((cells["world_size"] > 1).any()),
        serve=serve_section(run_dir, serving, out, _embedded), n_ok=int((everything["status"] == "ok").sum()),
        n_skipped=int((everything["status"] == "skipped").sum()),
        n_bad=int(everything["status"].isin(["failed", "timeout"]).sum()))


def _telemetry(run: Run, cells: pd.DataFrame, out: Path) -> list[dict]:
    """Small multiples of GPU utilisation, power and host CPU over each ok cell's timed steps."""
    if not run.has_table("samples"):
        return []
    samples = run.table("samples", SAMPLE_COLUMNS)
    ok = cells[cells["status"] == "ok"]
    found = []
    for metric in ("gpu_util_pct", "power_w", "cpu_util_pct"):
        if (samples["metric"] == metric).any() and len(ok):
            found += _figure(lambda: figures.telemetry_small_multiples(samples, ok, metric), out,  # noqa: B023
                             f"telemetry-{metric}")
    return found


def _cell_rows(cells: pd.DataFrame, cols: list) -> list[dict]:
    """The table of every cell: its values as shown, and its row's class (bad, warn)."""
    rows = []
    for _, r in cells.iterrows():
        bad = r["status"] in ("failed", "timeout") or r.get("parity_ok") is False
        note = r.get("profile_note", None)
        note = note if isinstance(note, str) and note else None  # a measured cell without its breakdown
        warn = is_false(r.get("stable")) or pd.notna(r.get("scaling_note", None)) or note is not None
        vals = [m.show(r.get(m.name)) for m in cols]
        if note is not None and r["status"] == "ok":
            vals[-1] = f"no breakdown: {note}"  # the reason column, empty for an ok cell
        rows.append({"cls": "bad" if bad else ("warn" if warn else ""), "vals": vals})
    return rows


def _comparison(run: Run, against: Against, out: Path) -> dict | None:
    """The statistical comparison as an HTML table, regressions first, from the same call and
    settings as ``parbench compare`` (:func:`bench.gate.verdict.judge`); with a history, its trend
    figures for the cells that are not 'same'."""
    baseline, history, threshold = against.baseline, against.history, against.threshold
    if baseline is None and history is None:
        return None

    gate = Gate() if threshold is None else Gate(threshold=threshold)
    judged = judge(run, baseline=baseline, history=history, gate=gate)
    figs = []
    if history is not None:

        trends = out / "trends"
        hist.show(history, judged.machine, gate.threshold, plots=trends)
        figs = sorted(trends.glob("*.png"))[:12]
    order = {"regression": 0, "broken": 1, "noisy": 2, "incomparable": 3, "improvement": 4, "fixed": 5}
    table = judged.table
    table = table.assign(_o=table["verdict"].map(order).fillna(9)).sort_values("_o", kind="stable")
    esc = jinja2.filters.escape
    rows = "".join(
        f"<tr class='{'bad' if v.verdict in ('regression', 'broken') else ''}'><td class='l'>{esc(v.cell)}</td>"
        f"<td class='l'><b>{esc(v.verdict)}</b></td><td class='n'>{esc(v.medians)}</td>"
        f"<td class='l n'>{esc(v.shift)}</td><td class='l'>{esc(v.basis)}</td><td>{esc(v.noise_floor)}</td>"
        f"<td class='l'>{esc(v.note)}</td></tr>" for v in verdict_rows(table).itertuples())
    imgs = "".join(f"<img src='data:image/png;base64,{img['data']}' alt='{esc(img['name'])}'>"
                   for img in map(_embedded, figs))
    html = (f"<p class='muted'>Threshold {gate.threshold:.1%} on step time, {1 - gate.alpha:.0%} intervals; a cell "
            "measured in one run a side is at most noisy (as <code>parbench compare</code> says it). "
            f"{esc(SHIFT_LEGEND[0].upper() + SHIFT_LEGEND[1:])}.</p>"
            "<table id='verdicts'><tr><th class='l'>cell</th><th class='l'>verdict</th>"
            "<th>median ms base &rarr; current</th><th class='l'>shift [interval]</th><th class='l'>shift of</th>"
            "<th>noise floor</th><th class='l'>note</th></tr>"
            f"{rows}</table>{imgs}")
    return {"base": judged.against, "html": html}
