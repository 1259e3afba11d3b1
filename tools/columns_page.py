"""docs/guides/columns.md, generated from the metric registry.

``python -m tools.columns_page`` prints the page; ``--write`` writes it to docs/guides/columns.md.
The cells table's columns come from :func:`bench.results.columns.all_metrics` (the core registry
of :mod:`bench.core.metrics`, every built-in strategy's declared columns, the serving columns);
the other tables' columns from their schemas in :mod:`bench.results.store` and
:mod:`bench.serve.schema`. ``tests/docs/test_columns_page.py`` keeps the committed page equal to
this output: after changing a metric, run ``python -m tools.columns_page --write``.

A metric's ``doc`` is its description. :data:`FALLBACK` describes the core columns whose registry
entry has no ``doc`` yet; the registry's own ``doc`` wins as soon as it has one.
"""

from __future__ import annotations

from pathlib import Path

from tools.generated import page_main

PAGE = Path(__file__).resolve().parents[1] / "docs" / "guides" / "columns.md"

#: descriptions of core columns whose registry entry has no ``doc`` (fields in braces: :func:`limits`)
FALLBACK: dict[str, str] = {
    "run_id": "the run folder's id",
    "cell_id": "the cell's number within the run",
    "strategy": "the strategy (or, for serving, the placement)",
    "device": "cpu or cuda",
    "status": "ok, failed, timeout or skipped",
    "reason": "why the cell failed, timed out or was skipped",
    "global_batch": "samples per step over all devices",
    "precision": "fp32 or bf16",
    "step_time_median_s": "median step time (over repeats when there are several); a step's time is its slowest rank's",
    "step_time_p95_s": "95th percentile of the timed steps (empty under {p95_min} steps)",
    "step_time_mean_s": "mean step time",
    "step_time_ci_low_s": "lower end of the 95% interval of the median",
    "step_time_ci_high_s": "upper end of the 95% interval of the median",
    "throughput_samples_s": "global batch / median step time",
    "mfu": "model FLOPs utilisation, for GPUs with a known peak",
    "peak_mem_bytes": "peak memory of the fullest rank",
    "loss_final": "global loss at the last timed step",
    "parity_ok": "the global loss matched one device's within parity_tol",
    "params": "the model's parameter count",
    "flops_per_sample": "training FLOPs per sample, as the workload gives them",
    "gpu_name": "the GPU model",
    "cell_wall_s": "wall time of the whole cell",
    "compute_time_s": "compute per step and rank, from the profiled steps",
    "comm_time_s": "communication per step and rank, from the profiled steps",
    "exposed_comm_s": "communication not overlapped by compute, per step and rank",
    "overlap_frac": "share of communication that ran under compute",
    "idle_frac": "share of the profiled step the device was idle",
    "timed_start_unix": "when the timed steps started (Unix time; telemetry uses the same clock)",
    "timed_end_unix": "when the timed steps ended (Unix time)",
    "energy_j": "GPU energy over the timed steps (empty for windows under {energy_min:g} s)",
    "energy_per_sample_j": "energy per trained sample",
    "samples_per_j": "trained samples per joule",
    "gpu_util_mean": "NVML GPU utilisation over the timed steps",
    "sm_active_mean": "SM activity (GPM) over the timed steps, where supported",
    "tensor_active_mean": "tensor-core activity (GPM) over the timed steps, where supported",
    "power_mean_w": "GPU power over the timed steps",
    "aggregate_bytes": "bytes gathered by the ensemble's final all_gather",
    "latency_p50_s": "median latency (empty under {p50_min} requests)",
    "latency_p95_s": "95th percentile latency (empty under {p95_requests} requests)",
    "latency_mean_s": "mean latency",
}



def limits() -> dict[str, float]:
    """The limits the descriptions quote, read from the code that applies them."""
    from bench.results.rows import ENERGY_MIN_WINDOW_S
    from bench.stats.serving import min_samples
    from bench.stats.steps import P95_MIN_STEPS

    return dict(p95_min=P95_MIN_STEPS, energy_min=ENERGY_MIN_WINDOW_S, p50_min=min_samples(50.0),
                p95_requests=min_samples(95.0))


KINDS = {"key": "key", "fact": "fact", "metric": "measured", "label": "setting"}


def _cell(text: str) -> str:
    """Text fit for one markdown table cell."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _where(m) -> str:
    where = [w for w in ("summary", "report") if w in m.shown]
    return ", ".join(where) or "-"


def _meaning(m) -> str:
    text = m.doc or FALLBACK.get(m.name, "").format(**limits())
    notes = []
    if m.derived:
        notes.append("derived when the run is read")
    if m.compared:
        notes.append("compared by `parbench compare`")
    if notes:
        text = f"{text} ({'; '.join(notes)})" if text else "; ".join(notes)
    return _cell(text)


def _unit(m) -> str:
    return m.unit or "-"


def _metric_rows(metrics, extra=None) -> list[str]:
    head = "| column | kind | type | unit | shown in | meaning |" + (" strategies |" if extra else "")
    rows = [head, "|---|---|---|---|---|---|" + ("---|" if extra else "")]
    for m in metrics:
        row = (f"| `{m.name}` | {KINDS.get(m.kind, m.kind)} | {m.dtype} | {_cell(_unit(m))} | {_where(m)} | "
               f"{_meaning(m)} |")
        if extra:
            row += f" {extra(m)} |"
        rows.append(row)
    return rows


def _schema_rows(columns: dict[str, str]) -> str:
    return ", ".join(f"`{name}` ({dtype})" for name, dtype in columns.items())


def page() -> str:
    """The page as markdown."""
    import strategies
    from bench.core.metrics import CORE, CORE_NAMES
    from bench.results.serve_columns import SERVE_METRICS
    from bench.results.store import COMM_COLUMNS, SAMPLE_COLUMNS, STEP_COLUMNS
    from bench.serve.schema import REQUEST_COLUMNS, TENANT_COLUMNS

    owners: dict[str, list[str]] = {}
    first: dict[str, object] = {}
    for name, cls in strategies.REGISTRY.items():
        for m in cls.columns():
            if m.name in CORE_NAMES:
                continue
            owners.setdefault(m.name, []).append(name)
            first.setdefault(m.name, m)
    strategy_metrics = list(first.values())
    seen = CORE_NAMES | set(first)
    serve = [m for m in SERVE_METRICS if m.name not in seen]

    out = [
        "# Columns",
        "",
        "<!-- Generated by tools/columns_page.py from the metric registry. Do not edit by hand: run",
        "     python -m tools.columns_page --write -->",
        "",
        "This page lists every column of the tables in a run folder, `results/<run-id>/`. It is for you",
        "when you read a run with pandas, filter the report's table, or write your own analysis.",
        "",
        "Read the cells with `bench.results.run.load_run(RUN)`: one row per cell, with the derived",
        "columns added. `pandas.read_parquet(RUN + '/cells.parquet')` reads the stored table as it is.",
        "",
        "Kinds: a **key** identifies a cell across runs (`parbench compare` pairs cells on the keys and",
        "the settings); a **fact** is planned or known before the cell runs; **measured** comes from the",
        "cell's run; a **setting** is a strategy's option or layout. *Shown in* says whether the end of",
        "`parbench run` (summary) or the HTML report's cell table (report) shows the column. Times are in",
        "seconds and shown in milliseconds; memory is in bytes and shown in GiB.",
        "",
        f"## cells.parquet: every cell ({len(CORE)} core columns)",
        "",
        *_metric_rows(CORE),
        "",
        f"## cells.parquet: strategy columns ({len(strategy_metrics)})",
        "",
        "A strategy adds its options (`option_<key>`, the value the cell ran with), its labels and its",
        "own measurements. A value a strategy returns without declaring it is kept in `extras` as",
        "`<strategy>.<key>`.",
        "",
        *_metric_rows(strategy_metrics, extra=lambda m: ", ".join(f"`{s}`" for s in owners[m.name])),
        "",
        f"## cells.parquet: serving columns ({len(serve)})",
        "",
        "Cells of `parbench serve` (`mode = serve`) fill these besides the core columns that mean the",
        "same thing (see [serving.md](serving.md)).",
        "",
        *_metric_rows(serve),
        "",
        "## The other tables",
        "",
        "Times in seconds; `t_unix` and `t` on the same clock as the cells' `timed_start_unix`.",
        "",
        f"- **steps.parquet**, one row per rank, repeat and step: {_schema_rows(STEP_COLUMNS)}.",
        f"- **comm.parquet**, one row per collective or point-to-point call of the profiled steps: "
        f"{_schema_rows(COMM_COLUMNS)}.",
        f"- **samples.parquet**, one row per telemetry sample: {_schema_rows(SAMPLE_COLUMNS)}.",
        f"- **requests.parquet** (serving), one row per request: {_schema_rows(REQUEST_COLUMNS)}.",
        f"- **serve_tenants.parquet** (serving), one row per cell and tenant: {_schema_rows(TENANT_COLUMNS)}.",
        "",
        "`parbench comm` writes `collectives.parquet` and `comm_model.parquet` instead; see",
        "[collectives.md](collectives.md).",
        "",
    ]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    return page_main(argv, prog="python -m tools.columns_page", doc=__doc__, page=page, path=PAGE)


if __name__ == "__main__":
    raise SystemExit(main())
