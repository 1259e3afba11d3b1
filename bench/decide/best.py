"""The answer of a run that searched: per workload, backend and world size, the whole configuration
to use (strategy, compile, checkpointing, batch per device, the strategy's searched options), its
margin over what the answer starts from (:func:`incumbent`: the library default unless a strategy
beats it beyond the noise) and over the runner-up, judged beyond the noise or not
(:func:`bench.decide.rules.judge_pair`), and a TOML file that measures exactly it again.

Configurations are ranked by throughput (samples a second), since the batch differs between them;
only cells that qualify as the recommendation's candidates count (ok, parity not failed). The answer
is the fastest where the run shows it ahead beyond the noise; where it does not, the one that
changes the fewest knobs among those the fastest has not beaten (:func:`simplest`), and the faster
one stands as the runner-up with its lead. What the search did, pruned and left untried is its
record in meta.json (``search``), read here as it is.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from bench.core.knobs import Training
from bench.decide.decision import Verdict
from bench.decide.recommend import candidates
from bench.decide.rules import clears, from_repeats, is_reference, judge_pair, library_default, num
from bench.results.run import Run

FILE = "best.toml"


@dataclass(frozen=True)
class Rival:
    """What the best configuration is weighed against: its configuration in words, its cell, the
    best's throughput over its, the pair's verdict (:class:`Verdict` value) and the rival's repeats."""

    config: str
    cell_id: int
    ratio: float
    verdict: str
    repeats: int = 1


@dataclass(frozen=True)
class Best:
    """One slot's answer (its configuration to use) and how it stands against its rivals."""

    workload: str
    backend: str
    world_size: int
    cell_id: int
    config: str
    throughput: float
    step_ms: float
    repeats: int
    measured: int  # configurations of this slot that qualified
    baseline: Rival | None = None  # what the answer starts from (incumbent): a strategy at its defaults
    runner_up: Rival | None = None
    recipe: dict[str, Any] = field(default_factory=dict)

    @property
    def title(self) -> str:
        return f"{self.workload} {self.backend} x{self.world_size}"

    @property
    def decided(self) -> bool:
        """The answer beats (or matches) its runner-up and what it starts from beyond the noise: a
        faster runner-up whose lead does not clear the band (verdict B) leaves it undecided."""
        return all(r is None or r.verdict in (Verdict.A, Verdict.SAME) for r in (self.baseline, self.runner_up))


def configuration(r: pd.Series, searched_options: tuple[tuple[str, Any], ...] = ()) -> str:
    """A row's configuration in words: 'ddp, compile on, checkpointing full, 8 samples per device
    (global 16), bucket_mb=100' (``searched_options``: (name, default), named where not the default)."""
    ws, gb = int(r["world_size"]), num(r.get("global_batch"))
    parts = [str(r["strategy"])]
    parts += [f"{'checkpointing' if k == 'ac' else k} {r[k]}" for k in ("compile", "ac") if k in r and pd.notna(r[k])]
    if gb:
        per = gb / ws
        parts.append(f"{per:g} samples per device" + (f" (global {gb:g})" if ws > 1 else ""))
    for name, default in searched_options:
        v = r.get(f"option_{name}")
        if v is not None and pd.notna(v) and v != default:
            parts.append(f"{name}={v:g}" if isinstance(v, float) else f"{name}={v}")
    return ", ".join(parts)


def _searched_options() -> tuple[tuple[str, Any], ...]:
    import strategies

    return tuple(sorted({(o.name, o.default) for s in strategies.names() for o in strategies.get(s).options
                         if o.search}, key=lambda x: x[0]))


def _rival(best: pd.Series, other: pd.Series | None, opts: tuple[str, ...], label: str = "") -> Rival | None:
    if other is None or int(other["cell_id"]) == int(best["cell_id"]):
        return None
    a, b = num(best.get("throughput_samples_s")), num(other.get("throughput_samples_s"))
    return Rival(config=label or configuration(other, opts), cell_id=int(other["cell_id"]),
                 ratio=a / b if a and b else float("nan"), verdict=str(judge_pair(best, other).state),
                 repeats=int(num(other.get("repeats_done")) or 1))


def leaders(cells: pd.DataFrame, k: int) -> dict[tuple[str, str, int], list[int]]:
    """Per slot, the cell ids of the ``k`` leading qualifying strategies (ok, parity not failed, one
    row each): what the slot's answer starts from (:func:`incumbent`) first, then the fastest of
    the others by throughput; at one device the single-device reference."""
    good, _ = candidates(cells)
    if good.empty:
        return {}
    good = good.sort_values("throughput_samples_s", ascending=False)
    out: dict[tuple[str, str, int], list[int]] = {}
    for (wl, be, ws), g in good.groupby(["workload", "backend", "world_size"], sort=True):
        g = g[is_reference(g)] if ws == 1 else g
        first = g.drop_duplicates("strategy")
        start = incumbent(first)
        if start is None:
            continue
        rest = [int(c) for c in first["cell_id"] if int(c) != int(start["cell_id"])]
        out[(str(wl), str(be), int(ws))] = [int(start["cell_id"]), *rest][:1 if ws == 1 else k]
    return out


def ranked(cells: pd.DataFrame, slot: tuple[str, str, int]) -> pd.DataFrame:
    """The qualifying measured configurations of ``slot``, fastest first (throughput: the batch
    differs between them)."""
    good, _ = candidates(cells)
    wl, be, ws = slot
    g = good[(good["workload"] == wl) & (good["backend"] == be) & (good["world_size"] == ws)]
    return g.sort_values("throughput_samples_s", ascending=False)


def _given(v: Any, default: Any) -> Any:
    """``v``, or ``default`` where the row holds nothing (None, NaN)."""
    return default if v is None or (not isinstance(v, str) and pd.isna(v)) else v


def changes(r: pd.Series, base: pd.Series | None, opts: tuple[tuple[str, Any], ...]) -> int:
    """How many knobs configuration ``r`` sets otherwise than ``base`` (what the answer starts from:
    :func:`incumbent`; without one, the knobs' defaults): strategy, compile, checkpointing, samples
    per device and the searched options."""
    knobs = {k: getattr(Training(), k) for k in ("compile", "ac")}
    if base is None:
        return sum(str(_given(r.get(k), d)) != d for k, d in knobs.items())

    def per(x):
        gb = num(x.get("global_batch"))
        return gb / int(x["world_size"]) if gb else None

    n = sum(str(r.get(k)) != str(base.get(k)) for k in ("strategy", *knobs)) + int(per(r) != per(base))
    return n + sum(_given(r.get(f"option_{name}"), d) != _given(base.get(f"option_{name}"), d) for name, d in opts)


def unsettled(fastest: pd.Series, r: pd.Series) -> bool:
    """Whether the run has not yet shown ``fastest`` ahead of ``r`` by more than EQUIVALENT beyond
    the noise, nor the two the same speed: :func:`judge_pair` OPEN (from repeats or from one run),
    or apart with a lead that does not clear the band at the intervals' edges (:func:`clears`).
    More repeats can settle it; the search's final rounds ask for them."""
    state = judge_pair(fastest, r).state
    return state == Verdict.OPEN or (state == Verdict.A and not clears(fastest, r))


def level(fastest: pd.Series, r: pd.Series) -> bool:
    """Whether ``r`` stands level with ``fastest`` for the answer: the same speed, or the lead not
    settled (:func:`unsettled`). A lead the run has not shown is no reason to change a knob: it
    stands as the runner-up, with its size, until repeats separate it (the recommendation's rule
    for strategies, applied to knobs). A lead of 3.4% at the medians, 0.5% at the edges, named
    another batch in one run of an A/A pair on 2 CPU cores and the defaults in the other."""
    return judge_pair(fastest, r).state == Verdict.SAME or unsettled(fastest, r)


def incumbent(screened: pd.DataFrame) -> pd.Series | None:
    """What a slot's answer starts from (``screened``: its screening-pass configurations, fastest
    first): the library default (:func:`bench.decide.rules.library_default`) unless the fastest
    beats it by more than EQUIVALENT beyond the noise (:func:`level`), then the fastest; None
    without any. A strategy that leads by less than that does not move the answer, so an A/A re-run
    starts from the same one."""
    if screened.empty:
        return None
    fastest, default = screened.iloc[0], library_default(screened, sharding=False)
    if default is None or not level(fastest, default):
        return fastest
    return default


def simplest(g: pd.DataFrame, base: pd.Series | None, opts: tuple[tuple[str, Any], ...]) -> pd.Series:
    """The answer among ``g`` (fastest first): of the configurations level with the fastest
    (:func:`level`), down to the first one the fastest beats (one measured slower than a
    configuration already ruled out is no candidate either), ``base`` itself, else one measured in
    repeats before one measured once, then the one that changes the fewest knobs from ``base``; the
    fastest where none is level. A practitioner changes no knob for less than the noise, and an A/A re-run that
    reorders configurations within it names the same answer: ``base`` itself unless the fastest
    beats it, and where it does, a configuration whose speed rests on repeats."""
    fastest = g.iloc[0]
    tied = [fastest]
    for _, r in g.iloc[1:].iterrows():
        if not level(fastest, r):
            break
        tied.append(r)
    def order(r: pd.Series) -> tuple[bool, int]:
        n = changes(r, base, opts)
        return n > 0 and not from_repeats(r), n

    return min(tied, key=order)  # min keeps the faster of equals


def searched(meta: dict) -> set[int]:
    """The cell ids the run's search measured (its candidates and their references)."""
    record = meta.get("search") if isinstance(meta.get("search"), dict) else None
    return stage_cells((record or {}).get("stages", []))


def stage_cells(stages: list[dict]) -> set[int]:
    """The cell ids the search's ``stages`` (as meta.json records them) measured."""
    return {int(c) for st in stages for c in st.get("cells", [])}


def answers(run: Run) -> list[Best]:
    """The best configuration of every slot the run's search covered (none when it did not search)."""
    record = run.meta.get("search") if isinstance(run.meta.get("search"), dict) else None
    if not record or "slots" not in record:
        return []
    ids = searched(run.meta)
    recipes = record.get("recipes") or {}
    good, _ = candidates(run.training)
    opts = _searched_options()
    out = []
    for title in record["slots"]:
        wl, be, ws = title.rsplit(" ", 2)
        g = good[(good["workload"] == wl) & (good["backend"] == be) & (good["world_size"] == int(ws[1:]))]
        if g.empty:
            continue
        g = g.sort_values("throughput_samples_s", ascending=False)
        base = incumbent(g[~g["cell_id"].isin(ids)])
        best = simplest(g, base, opts)
        label = f"{base['strategy']} at its defaults" if base is not None else ""
        others = g[g["cell_id"] != best["cell_id"]]
        runner = others.iloc[0] if len(others) else None
        reps = int(num(best.get("repeats_done")) or 1)
        out.append(Best(workload=wl, backend=be, world_size=int(ws[1:]), cell_id=int(best["cell_id"]),
                        config=configuration(best, opts), throughput=float(best["throughput_samples_s"]),
                        step_ms=float(best["step_time_median_s"]) * 1e3, repeats=reps, measured=len(g),
                        baseline=_rival(best, base, opts, label), runner_up=_rival(best, runner, opts),
                        recipe=recipes.get(str(int(best["cell_id"]))) or {}))
    return out


def recipe(spec) -> dict[str, Any]:
    """The settings that measure cell ``spec`` (a :class:`bench.core.spec.CellSpec`) again, alone
    with its single-device reference, three repeats, no search."""
    w = spec.workload
    dims = {k: v for k, v in w.dims.items() if k != "global_batch"}
    text = w.spec + (f"[{','.join(f'{k}={v}' for k, v in sorted(dims.items()))}]" if dims else "")
    given = {o.name: spec.options[o.name] for o in _declared(spec.strategy_spec)
             if spec.options.get(o.name) is not None and spec.options[o.name] != o.default}
    return {"workloads": [text], "strategies": [spec.strategy_spec], "backends": [spec.backend],
            "world_sizes": [spec.n_devices], "device": spec.device, "precision": spec.measure.precision,
            "global_batch": w.global_batch, "scaling": spec.scaling, "seed": spec.measure.seed,
            "repeats": 3, "search": "off",
            "training": {k: [v] for k, v in spec.training.knobs().items()}, "lr": spec.training.lr,
            "options": given}


def _declared(strategy_spec: str):
    import strategies

    return strategies.get(strategy_spec).options


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    s = str(v).replace("\\", "\\\\").replace('"', '\\"')
    return f'"{s}"'


def toml_text(best: Best, run_path: str) -> str:
    """``best``'s recipe as a TOML file for ``parbench run --config``."""
    r = best.recipe
    lines = [f"# The configuration to use that the search of {run_path} found for {best.title}:",
             f"# {best.config}, {best.step_ms:.1f} ms/step, {best.throughput:.1f} samples/s over {best.repeats} "
             "repeat(s).", "# parbench run --config this-file measures exactly it again (3 repeats, no search)."]
    lines += [f"{k} = {_toml_value(v)}" for k, v in r.items() if not isinstance(v, dict)]
    for table in ("training", "options"):
        if r.get(table):
            lines += ["", f"[{table}]"] + [f"{k} = {_toml_value(v)}" for k, v in r[table].items()]
    return "\n".join(lines) + "\n"


def write(run: Run, found: list[Best]) -> Path | None:
    """RUN/best.toml: the recipe of the first workload's fastest configuration over its slots (in
    samples a second), the others as commented alternatives; None when nothing was found or the
    folder cannot take it."""
    found = [b for b in found if b.recipe]
    if run.path is None or not found:
        return None
    wl = found[0].workload
    first = max((b for b in found if b.workload == wl), key=lambda b: b.throughput)
    text = toml_text(first, str(run.path))
    others = [b for b in found if b is not first]
    if others:
        text += "\n# Other slots' fastest configurations (their recipes are in meta.json, search.recipes):\n"
        text += "".join(f"#   {b.title}: {b.config} (cell {b.cell_id})\n" for b in others)
    path = Path(run.path) / FILE
    try:
        tmp = path.with_name(f".{FILE}.partial")
        tmp.write_text(text)
        tmp.replace(path)
    except OSError:
        return None
    return path
