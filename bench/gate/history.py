"""An append-only history of runs, keyed by git commit and machine, with step detection.

Layout of a store ``DIR``::

    DIR/index.jsonl                      one line per added run (append only)
    DIR/<machine>/<seq>-<run_id>.parquet one row per cell: key, dimensions, status, step samples

A run is never rewritten or removed by this module; adding the same run twice is an error. The
machine is a fingerprint of meta.json's host, GPUs, torch, NCCL and CPU (or a name given with
``--machine``, for CI runners whose host name changes every job).

Change points over commits come from :func:`bench.stats.changepoints.detect_steps`.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import re
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from bench.core import knobs
from bench.core.errors import UserError
from bench.core.paths import folder_problem
from bench.gate.ciout import cell_name
from bench.gate.compare import DIMENSIONS, KEY, OPTIONAL_KEY
from bench.gate.samples import MIN_REPEATS, Samples, cell_samples
from bench.results.bounds import depth, safe_name
from bench.results.migrate import training_knobs
from bench.results.run import load_run
from bench.results.store import frame, read_table, require_columns
from bench.runtime.signals import defer_stops
from bench.stats.changepoints import detect_steps, quartiles

DEFAULT_STORE = "results/history"
MACHINE_FIELDS = ("host", "gpus", "torch", "nccl", "cpu")
CELL_FIELDS = [*KEY, *OPTIONAL_KEY, *knobs.NAMES, "status", "reason", *DIMENSIONS, "throughput_samples_s",
               "step_time_median_s", "step_time_ci_low_s", "step_time_ci_high_s"]


def machine_of(meta: dict[str, Any]) -> dict[str, Any]:
    """The fields of meta.json that say which machine and software stack measured a run."""
    m = {k: meta.get(k) for k in MACHINE_FIELDS}
    if m["cpu"] is None:  # the CPU model of meta.json's fingerprint, else the platform string
        m["cpu"] = (meta.get("fingerprint") or {}).get("cpu_model") or meta.get("platform")
    if isinstance(m["gpus"], list):
        m["gpus"] = sorted(map(str, m["gpus"]))
    return m


def fingerprint(meta: dict[str, Any]) -> str:
    """12 hex digits naming the machine of ``meta``: equal machines, equal names."""
    blob = json.dumps(machine_of(meta), sort_keys=True, default=str)
    return hashlib.sha1(blob.encode()).hexdigest()[:12]


def _check_name(name: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", name):
        raise UserError(f"machine name {name!r} must be letters, digits, '.', '_' or '-'; e.g. --machine ci-cpu")
    return name


#: the index of a store larger than this is refused (about 100,000 runs)
INDEX_MAX_BYTES = 64 * 2**20
_INDEX_TYPES = {"seq": (int,), "commit": (str,), "machine": (str,), "run_id": (str,), "file": (str,),
                "machine_info": (dict,)}
_STORED_NEEDS = [*KEY, "status", "samples", "unit", "step_time_median_s"]
_STORED_TYPES = {**dict.fromkeys((*KEY, "status", "unit"), "string"), "step_time_median_s": "float64"}
log = logging.getLogger("parbench")


def read_index(store: str | os.PathLike) -> pd.DataFrame:
    """The index of a store, one row per added run, in the order they were added. A line that is
    not a whole entry (an add stopped by a full disk, an edit) is skipped with a warning naming it;
    a store whose index is not a file, or too large, is a one-line UserError."""
    p = Path(store) / "index.jsonl"
    cols = ["seq", "commit", "machine", "run_id", "created_utc", "added_utc", "file", "machine_info"]
    if p.exists() and not p.is_file():
        raise UserError(f"{p} is not a file; --store must be a history folder made by parbench history add")
    if not p.is_file():
        return pd.DataFrame(columns=cols)
    if p.stat().st_size > INDEX_MAX_BYTES:
        raise UserError(f"{p} is over {INDEX_MAX_BYTES // 2**20} MiB, more than a parbench history holds; "
                        "is --store a history folder?")
    rows, skipped = [], []
    for n, line in enumerate(p.read_bytes().decode(errors="replace").splitlines(), 1):
        if line.strip():
            why = _entry_problem(line)
            if why:
                skipped.append(f"{p} line {n} skipped: {why}")
            else:
                rows.append(json.loads(line))
    if skipped and not rows:
        raise UserError(f"{skipped[0].replace(' skipped', '')}, and no line of it is an entry; restore the index "
                        "or move the store aside")
    for why in skipped:
        log.warning("%s", why)
    return pd.DataFrame(rows, columns=cols)


def _entry_problem(line: str) -> str | None:
    """Why one index line is not an entry this module wrote, or None."""
    try:
        e = json.loads(line)
    except (ValueError, RecursionError):
        return "not JSON"
    if not isinstance(e, dict):
        return "not a JSON object"
    for k, types in _INDEX_TYPES.items():
        if not isinstance(e.get(k), types) or isinstance(e.get(k), bool):
            return f"{k!r} missing or not {types[0].__name__}"
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", e["machine"]):
        return f"machine {e['machine'][:60]!r} is not a machine name"
    if e["seq"] < 0:
        return f"seq {e['seq']} is negative"
    f = Path(e["file"])
    if f.is_absolute() or ".." in f.parts or f.suffix != ".parquet":
        return f"file {e['file'][:60]!r} is not a parquet file inside the store"
    if depth(e["machine_info"]) > 4:
        return "machine_info nested too deep"
    return None


def add(run_dir: str | os.PathLike, store: str | os.PathLike = DEFAULT_STORE, *, commit: str | None = None,
        machine: str | None = None) -> dict[str, Any]:
    """Append one run to the store; returns its index entry. The run's cells are written first and
    the index line last, in one write: a stopped add leaves the store as it was (at most an unlisted
    file)."""
    log.info("reading run %s", run_dir)
    cells, steps, meta = load_run(run_dir)
    commit = commit or meta.get("git_commit")
    if not commit:
        raise UserError(f"{run_dir} has no git_commit in meta.json; run from a git checkout or pass --commit SHA")
    mach = _check_name(machine) if machine else fingerprint(meta)
    run_id = str(meta.get("run_id") or Path(run_dir).name)
    store = Path(store)
    index = read_index(store)
    if ((index["run_id"] == run_id) & (index["machine"] == mach)).any():
        raise UserError(f"run {run_id} is already in {store} for machine {mach}; the history is append-only")
    samples = cell_samples(steps)
    rec = cells.reindex(columns=CELL_FIELDS).copy()
    for k in (*KEY, *OPTIONAL_KEY, *knobs.NAMES, "status", "reason", "precision", "gpu_name"):
        rec[k] = rec[k].map(lambda v: None if pd.isna(v) else str(v)).astype("string")
    got = [samples.get(int(c)) if pd.notna(c) else None for c in cells["cell_id"]]
    rec["samples"] = [list(map(float, s.values)) if s else [] for s in got]
    rec["unit"] = [s.unit if s else "" for s in got]
    seq = int(index["seq"].max()) + 1 if len(index) else 0
    # run_id comes from meta.json: only its safe characters name the file
    rel = Path(mach) / f"{seq:06d}-{safe_name(run_id)}.parquet"
    tmp = store / rel.with_name(f".{rel.name}.tmp")
    entry = dict(seq=seq, commit=str(commit), machine=mach, run_id=run_id, created_utc=meta.get("created_utc"),
                 added_utc=datetime.now(timezone.utc).isoformat(timespec="seconds"), file=str(rel),
                 machine_info=machine_of(meta))
    log.info("adding run %s (%d cells) to %s as %s", run_id, len(rec), store, rel)
    listed = False
    defer_stops(True)  # a stop signal is raised after the add, never between its two writes
    try:
        (store / mach).mkdir(parents=True, exist_ok=True)
        rec.to_parquet(tmp, index=False)
        os.replace(tmp, store / rel)
        _append_line(store / "index.jsonl", json.dumps(entry, default=str))  # makes the run part of the history
        listed = True
    except OSError as e:
        raise UserError(f"--store {str(store)!r} cannot be written ({e.strerror or e}); pass a writable "
                        "folder") from None
    finally:
        defer_stops(False)
        if not listed:  # nothing of a failed add stays behind
            for f in (tmp, store / rel):
                with contextlib.suppress(OSError):
                    f.unlink(missing_ok=True)
    return entry


def _append_line(path: Path, line: str) -> None:
    """Append ``line`` in one write; on a short or failed write the file is cut back to its size
    before, so the index never keeps half an entry."""
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        size = os.fstat(fd).st_size
        data = (b"\n" if size and os.pread(fd, 1, size - 1) != b"\n" else b"") + line.encode() + b"\n"
        try:
            if os.write(fd, data) != len(data):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        except OSError:
            os.ftruncate(fd, size)
            raise
    finally:
        os.close(fd)


def load(store: str | os.PathLike, machine: str | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(index rows of one machine, every stored cell row of them with seq/commit columns). A stored
    file that cannot be read or lacks columns is skipped with a warning naming it."""
    store = Path(store)
    index = read_index(store)
    if index.empty:
        raise UserError(f"{store} holds no history; add runs with: parbench history add RUN --store {store}")
    machines = index["machine"].unique().tolist()
    if machine is None:
        if len(machines) > 1:
            raise UserError(f"{store} holds {len(machines)} machines ({', '.join(machines)}); pick one with --machine")
        machine = machines[0]
    index = index[index["machine"] == machine]
    if index.empty:
        raise UserError(f"{store} has no runs of machine {machine}; known: {', '.join(machines)}")
    frames, problems = [], []
    for _, e in index.iterrows():
        try:
            frames.append(_stored(store / e["file"]).assign(seq=e["seq"], commit=e["commit"]))
        except UserError as err:
            problems.append(str(err))
    if not frames:
        raise UserError(f"none of the {len(index)} run(s) of machine {machine} in {store} can be read ({problems[0]}); "
                        "restore the store or add runs again")
    for why in problems:  # the rest of the history still loads
        log.warning("a run of the history was left out: %s", why)
    return index, pd.concat(frames, ignore_index=True)


def _stored(path: Path) -> pd.DataFrame:
    """One stored run's cell rows; a UserError naming the file when it cannot be read."""
    if not path.is_file():
        raise UserError(f"{path} is missing or not a file")
    df = read_table(path.parent, path.name.removesuffix(".parquet"))
    require_columns(df, _STORED_NEEDS, str(path))
    df = frame(df, _STORED_TYPES, source=str(path))
    df[["status", "unit"]] = df[["status", "unit"]].fillna("")
    for name in knobs.NAMES:
        if name in df:
            df[name] = df[name].replace("", None)
    training_knobs(df)  # a run stored before the knobs trained with the legacy ones
    try:
        df["samples"] = [np.asarray(x if x is not None else [], float).ravel() for x in df["samples"]]
    except (TypeError, ValueError):
        raise UserError(f"{path}: column 'samples' holds something other than lists of numbers") from None
    return df


def cell_label(row: pd.Series | dict) -> str:
    """'workload/strategy/backend/device/wsN' (+ mesh etc. when set): the name of a series."""

    return cell_name(row)


def _run_values(samples: list, recs: list[dict]) -> list[float]:
    """One value per run: the median of its per-repeat medians when it had repeats, else of its
    steps. Repeats of one run share that run's drift, so they are not draws of the run-to-run
    noise; only whole runs are."""
    out: list[float] = []
    for smp, r in zip(samples, recs):
        x = np.asarray(smp, float)
        if x.size:
            out.append(float(np.median(x)))
        elif np.isfinite(r.get("step_time_median_s") or np.nan):
            out.append(float(r["step_time_median_s"]))
    return out


def series(rows: pd.DataFrame) -> dict[str, dict[str, Any]]:
    """label -> columns with one entry per commit (in the order commits first entered the history):
    ``commit``, ``value`` (median step time), ``q25``/``q75`` of the pooled samples, ``samples``
    (pooled), ``unit``, ``runs`` (one value per run, see :func:`_run_values`), ``last`` (the
    commit's latest cell record). Columns are plain lists and arrays, not frames: cheap to build
    for 1,000 cells.

    Plain Python over the records: a history of 1,000 cells x many commits is many tiny groups,
    where pandas' per-group overhead would dominate."""
    ok = rows[rows["status"] == "ok"]
    recs = ok.drop(columns=["samples"]).to_dict("records")
    first: dict[str, int] = {}
    for r in recs:
        first[r["commit"]] = min(first.get(r["commit"], r["seq"]), r["seq"])
    groups: dict[str, dict[str, list[int]]] = {}
    for i, r in enumerate(recs):
        groups.setdefault(cell_label(r), {}).setdefault(r["commit"], []).append(i)
    samples = ok["samples"].tolist()
    out = {}
    for label in sorted(groups):
        per_commit = []
        for commit, idx in sorted(groups[label].items(), key=lambda kv: first[kv[0]]):
            parts = [np.asarray(samples[i], float) for i in idx]
            pooled = np.concatenate(parts) if parts else np.array([])
            if pooled.size == 0:
                pooled = np.array([recs[i]["step_time_median_s"] for i in idx], float)
                pooled = pooled[np.isfinite(pooled)]
            if pooled.size == 0:
                continue
            q25, med, q75 = quartiles(pooled)
            last = recs[idx[-1]]
            per_commit.append(dict(commit=commit, order=first[commit], value=float(med), q25=float(q25),
                                   q75=float(q75), samples=pooled, unit=last["unit"], last=last,
                                   runs=_run_values([samples[i] for i in idx], [recs[i] for i in idx])))
        if per_commit:
            cols = {k: [c[k] for c in per_commit] for k in per_commit[0]}
            for k in ("value", "q25", "q75"):
                cols[k] = np.asarray(cols[k], float)
            out[label] = cols
    return out


def analyze(s: dict[str, Any], threshold: float = 0.05) -> dict[str, Any]:
    """Change points of one series (on log step time) and its last stable segment."""
    v = s["value"]
    starts = detect_steps(np.log(v))
    bounds = list(zip(starts, starts[1:] + [len(v)]))
    levels = [float(np.median(v[a:b])) for a, b in bounds]
    changes = []
    for (a, _), before, after in zip(bounds[1:], levels, levels[1:]):
        rel = after / before - 1
        changes.append(dict(commit=s["commit"][a], before=before, after=after, change=rel,
                            kind="regression" if rel > threshold else "improvement" if rel < -threshold else "shift"))
    return dict(starts=starts, levels=levels, changes=changes, stable_from=starts[-1], last=float(v[-1]),
                stable=levels[-1])


def show(store: str | os.PathLike, machine: str | None = None, threshold: float = 0.05,
         plots: str | os.PathLike | None = None) -> pd.DataFrame:
    """One row per cell: commits seen, last and stable step time, change points; writes one
    trend PNG per cell under ``plots`` when given."""
    _, rows = load(store, machine)
    if plots is not None:  # before any figure, so an unwritable --plots fails before the analysis

        why = folder_problem(plots)
        if why:
            raise UserError(f"--plots {str(plots)!r} cannot be written ({why}); pass a writable folder")
    out = []
    for label, s in series(rows).items():
        a = analyze(s, threshold)
        out.append(dict(cell=label, commits=len(s["value"]), last_s=a["last"], stable_s=a["stable"],
                        stable_since=s["commit"][a["stable_from"]],
                        changes="; ".join(f"{c['commit'][:10]} {c['change']:+.1%} ({c['kind']})" for c in a["changes"]),
                        regressions=sum(c["kind"] == "regression" for c in a["changes"])))
        if plots is not None:
            try:
                trend_png(label, s, a, Path(plots))
            except OSError as e:
                raise UserError(f"--plots {str(plots)!r} cannot be written ({e.strerror or e}); free space or pass "
                                "another folder") from None
    return pd.DataFrame(out)


def trend_png(label: str, s: dict[str, Any], a: dict[str, Any], out_dir: Path) -> Path:
    """One cell's step time per commit, with its fitted levels and change points."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    n = len(s["value"])
    x = np.arange(n)
    ms = 1e3
    fig, ax = plt.subplots(figsize=(max(5.0, 0.35 * n + 2), 3.2))
    ax.errorbar(x, s["value"] * ms, yerr=[(s["value"] - s["q25"]) * ms, (s["q75"] - s["value"]) * ms],
                fmt="o", ms=4, capsize=2, label="median (IQR)")
    bounds = list(zip(a["starts"], a["starts"][1:] + [n]))
    for (lo, hi), lev in zip(bounds, a["levels"]):
        ax.hlines(lev * ms, lo - 0.4, hi - 0.6, colors="C1", label="fitted level" if lo == 0 else None)
    for lo, _ in bounds[1:]:
        ax.axvline(lo - 0.5, color="C3", ls="--", lw=1)
    # commits and labels come from the store: plain text, never mathtext
    ax.set_xticks(x, [str(c)[:7] for c in s["commit"]], rotation=60, fontsize=7, parse_math=False)
    ax.set_ylabel("step time (ms)")
    ax.set_title(label, fontsize=9, parse_math=False)
    ax.legend(fontsize=7)
    fig.tight_layout()
    path = out_dir / (safe_name(label, 120) + ".png")
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def baseline(store: str | os.PathLike, machine: str | None = None, max_commits: int = 10, min_runs: int = 4
             ) -> tuple[pd.DataFrame, dict[int, Samples], dict[str, Any]]:
    """A synthetic BASE run for ``regress.compare``: per cell, the last stable segment (at most
    ``max_commits`` commits) as samples, the cell row of its latest record, and the machine's meta
    (torch, NCCL, GPUs) so run-level incomparability is still caught.

    With >= ``min_runs`` runs in the segment the samples are per-run medians (unit "runs", one
    value per run whatever its repeats): the comparison then tests CURRENT against the run-to-run
    noise the history measured. With fewer runs (2 runs of 5 repeats are 2 runs, not 10), the
    segment's steps (or repeats) are pooled and tested as in a run-against-run comparison; the
    samples then carry how many runs they came from, for the verdict's note."""
    index, rows = load(store, machine)
    cells, samples = [], {}
    for i, (_, s) in enumerate(series(rows).items()):
        a = analyze(s)
        first = max(a["stable_from"], len(s["value"]) - max_commits)
        seg = {k: col[first:] for k, col in s.items()}
        unit = seg["unit"][-1]
        runs = [v for vals in seg["runs"] for v in vals]  # one value per run (see _run_values)
        last = {k: v for k, v in seg["last"][-1].items() if k not in ("samples", "unit", "seq", "commit")}
        cells.append({**last, "cell_id": i, "status": "ok"})
        if len(runs) >= min_runs:  # enough runs to measure the run-to-run noise: test against it
            samples[i] = Samples(np.asarray(runs, float), "runs", runs=len(runs))
        elif unit:
            pooled = [x for x, u in zip(seg["samples"], seg["unit"]) if u == unit]
            vals = np.concatenate(pooled)
            samples[i] = Samples(vals, unit if unit == "steps" or len(vals) >= MIN_REPEATS else "steps",
                                 runs=len(runs))
    if not cells:
        raise UserError(f"{store} holds no ok cell for machine {index['machine'].iloc[0]}; nothing to compare with")
    base = pd.DataFrame(cells)
    for k in ("world_size", "micro_batches"):  # stored as text; numbers again, as in a run's cells
        if k in base:
            base[k] = pd.to_numeric(base[k].replace("", None), errors="coerce")
    return base, samples, dict(index["machine_info"].iloc[-1])
