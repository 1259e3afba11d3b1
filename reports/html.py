"""The HTML report: one self-contained page (PNG figures beside it, no network)."""

from __future__ import annotations

import re
from pathlib import Path

import jinja2
import pandas as pd

from bench.results import load_run
from reports import figures

TEMPLATE = """<!doctype html>
<html><head><meta charset="utf-8"><title>parbench {{ meta.run_id }}</title>
<style>
body{font-family:system-ui,sans-serif;margin:2em;max-width:1400px}
table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;padding:3px 6px;text-align:right}
th{background:#f0f0f0}td.l{text-align:left}.bad{background:#fdd}.skip{color:#888}
img{max-width:100%;border:1px solid #eee;margin:6px 0}code{background:#f6f6f6}
</style></head><body>
<h1>parbench run <code>{{ meta.run_id }}</code></h1>
<p>{{ meta.created_utc }} &middot; host <code>{{ meta.host }}</code> &middot; torch {{ meta.torch }}
{% if meta.cuda %}&middot; CUDA {{ meta.cuda }}{% endif %}{% if meta.nccl %} &middot; NCCL {{ meta.nccl }}{% endif %}
{% if meta.gpus %}&middot; GPUs: {{ meta.gpus|join(", ") }}{% endif %}
{% if meta.driver %}&middot; driver {{ meta.driver }}{% endif %} &middot; commit <code>{{ meta.git_commit }}</code></p>
<p>{{ n_ok }} cells ok, {{ n_skipped }} skipped, {{ n_bad }} failed or timed out.
Step time is the maximum over ranks of each step; throughput is global batch / median step time;
scaling efficiency is throughput / (world size x single-device throughput); parity compares the
loss at every step with the single-device run on the same batches.</p>
{% for wl in workloads %}
<h2>{{ wl.name }}</h2><p>{{ wl.description }}</p>
{% for img in wl.images %}<img src="{{ img }}" alt="{{ img }}">{% endfor %}
{% endfor %}
{% if telemetry %}<h2>Telemetry</h2>{% for img in telemetry %}<img src="{{ img }}" alt="{{ img }}">{% endfor %}
{% endif %}{% if meta.telemetry %}<p>Telemetry notes: {% for k, v in meta.telemetry.items() %}
<code>{{ k }}</code>: {{ v }}; {% endfor %}</p>{% endif %}
<h2>All cells</h2>
<table><tr>{% for c in columns %}<th>{{ c }}</th>{% endfor %}</tr>
{% for r in rows %}<tr class="{{ r.cls }}">{% for v in r.vals %}
<td class="{{ 'l' if loop.index <= 5 or loop.last else '' }}">{{ v }}</td>{% endfor %}</tr>
{% endfor %}</table>
</body></html>
"""

def table_columns(columns) -> list:
    """The report table's columns: keys and status, the registry's report metrics, then the reason."""
    from bench.metrics import lookup, shown

    head = [lookup(c) for c in ("workload", "strategy", "backend", "world_size", "status")]
    body = [m for m in shown("report", columns) if m.name not in {h.name for h in head}]
    return head + body + [lookup("reason")]


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text)


def build_report(run_dir: Path, out: Path | None = None) -> Path:
    """Write ``index.html`` and its PNG figures into ``out`` (default RUN_DIR/report); returns the
    HTML path."""
    run_dir = Path(run_dir)
    cells, steps, meta = load_run(run_dir)
    out = Path(out) if out else run_dir / "report"
    out.mkdir(parents=True, exist_ok=True)
    described = meta.get("workloads", {})
    wls = []
    for wl in cells["workload"].dropna().unique():
        images = []
        ok = cells[(cells["workload"] == wl) & (cells["status"] == "ok")]
        if not ok.empty:
            kinds = [("throughput", lambda: figures.throughput_bars(cells, wl)),
                     ("steptime", lambda: figures.step_time_boxes(cells, steps, wl)),
                     ("scaling", lambda: figures.scaling_lines(cells, wl))]
            if "comm_time_s" in ok and ok["comm_time_s"].notna().any():
                kinds.append(("breakdown", lambda: figures.breakdown_bars(cells, wl)))
            if ok["peak_mem_bytes"].notna().any():
                kinds.append(("memory", lambda: figures.memory_bars(cells, wl)))
            for kind, fn in kinds:
                name = f"{_slug(wl)}-{kind}.png"
                figures.save(fn(), out / name)  # noqa: B023 - called at once
                images.append(name)
        wls.append({"name": wl, "description": described.get(wl, ""), "images": images})
    telemetry = []
    samples_path = run_dir / "samples.parquet"
    if samples_path.is_file():
        samples = pd.read_parquet(samples_path)
        for metric in ("gpu_util_pct", "power_w", "sm_active_pct", "cpu_util_pct"):
            if (samples["metric"] == metric).any():
                name = f"telemetry-{metric}.png"
                figures.save(figures.telemetry_lines(samples, cells, metric), out / name)
                telemetry.append(name)
    cols = table_columns(cells.columns)
    rows = []
    for _, r in cells.iterrows():
        bad = r["status"] in ("failed", "timeout") or r.get("parity_ok") is False
        cls = "bad" if bad else ("skip" if r["status"] == "skipped" else "")
        rows.append({"cls": cls, "vals": [m.show(r.get(m.name)) for m in cols]})
    html = jinja2.Environment(autoescape=True).from_string(TEMPLATE).render(
        meta={"run_id": run_dir.name, **meta}, workloads=wls, telemetry=telemetry,
        columns=[m.title for m in cols], rows=rows,
        n_ok=int((cells["status"] == "ok").sum()), n_skipped=int((cells["status"] == "skipped").sum()),
        n_bad=int(cells["status"].isin(["failed", "timeout"]).sum()))
    path = out / "index.html"
    path.write_text(html)
    return path
