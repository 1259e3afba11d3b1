"""The knob search in words and tables: each slot's configuration to use with its margins
(:mod:`bench.decide.best`), what was searched, pruned and left untried (meta.json ``search``), and,
for a run of one GPU, the estimates at 2, 4 and 8 GPUs (:mod:`bench.decide.scaleout`). The terminal
prints :func:`lines`; the report renders :func:`section`.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from bench.decide import best as found_best
from bench.decide import scaleout
from bench.decide.decision import Verdict
from bench.decide.rules import num
from bench.results.run import Run

_VERDICT = {Verdict.A: "beyond the noise", Verdict.SAME: "the same speed (within 3%)",
            Verdict.OPEN: "not separated from the noise", Verdict.B: "slower, beyond the noise"}


def _unjudged(repeats: int, r: found_best.Rival) -> str:
    """Why a pair with fewer than 3 repeats on a side is not judged, in words."""
    if repeats == 1 and r.repeats == 1:
        return "one run each: not judged"
    return "one run: not judged" if 1 in (repeats, r.repeats) else "not judged (under 3 repeats)"


def margin(r: found_best.Rival | None, repeats: int) -> str:
    """'1.32x ddp at its defaults, beyond the noise' ('' without a rival)."""
    if r is None:
        return ""
    judged = _VERDICT.get(Verdict(r.verdict), r.verdict) if min(repeats, r.repeats) >= 3 else _unjudged(repeats, r)
    return f"{r.ratio:.2f}x {r.config}, {judged}"


def answer_lines(b: found_best.Best) -> list[str]:
    """A slot's answer: its configuration and margin first, then the runner-up."""
    head = f"configuration to use, {b.title}: {b.config}: {b.step_ms:.1f} ms/step, {b.throughput:.1f} samples/s"
    vs = margin(b.baseline, b.repeats)
    out = [head + (f"; {vs}" if vs else "; the strategy's defaults themselves") +
           f" ({b.repeats} repeat{'s' if b.repeats != 1 else ''}; {b.measured} configurations compared)"]
    if b.runner_up is not None:
        ratio = b.runner_up.ratio
        behind = 1 - 1 / ratio if ratio else float("nan")
        judged = _VERDICT.get(Verdict(b.runner_up.verdict), "") if min(b.repeats, b.runner_up.repeats) >= 3 \
            else _unjudged(b.repeats, b.runner_up)
        mine = set(b.config.split(", "))
        differs = [p for p in b.runner_up.config.split(", ") if p not in mine]
        if ratio and ratio < 1:  # faster, but not by more than the noise and 3%: the answer changes fewer knobs
            if b.runner_up.verdict == Verdict.B:
                judged = "beyond the noise, but not by 3% beyond it"
            amount = f"{-behind:.1%} more samples/s, {judged}: the answer changes fewer knobs"
        else:
            amount = f"{behind:.1%} fewer samples/s, {judged}"
        out.append(f"runner-up: {b.runner_up.config}: {amount}"
                   + (f" (it differs in: {', '.join(differs)})" if differs else ""))
    return out


def record(run: Run) -> dict[str, Any] | None:
    s = run.meta.get("search")
    return s if isinstance(s, dict) else None


def summary(rec: dict[str, Any]) -> str:
    """What the search measured, pruned and would take to widen, in one line."""
    if rec.get("skipped"):
        return f"search: not run ({rec['skipped']})"
    why = Counter(p.get("why", "?") for p in rec.get("pruned", []))
    pruned = ", ".join(f"{k} {n}" for k, n in sorted(why.items())) or "none"
    wider = rec.get("wider_minutes")
    return (f"search ({rec.get('mode')}): {len(rec.get('measured', []))} configurations measured of "
            f"{rec.get('candidates', 0)} planned; pruned: {pruned}"
            + (f"; measuring every one that can run, 3 repeats each, would take about {wider:g} min "
               f"(parbench tune searches wider)" if wider else ""))


def estimates(run: Run, found: list[found_best.Best]) -> tuple[str, list[scaleout.Estimate]] | None:
    """(the slot, its estimates) for a run that measured one GPU only; None otherwise."""
    cells = run.training
    if cells.empty or (cells["world_size"] > 1).any() or not (cells["device"] == "cuda").any():
        return None
    for b in found:
        row = cells[cells["cell_id"] == b.cell_id]
        params = num(row["params"].iloc[0]) if len(row) and "params" in row else None
        est = scaleout.estimate(b.step_ms / 1e3, params or 0)
        if est:
            return b.title, est
    return None


def lines(run: Run, found: list[found_best.Best] | None = None, toml: Path | None = None) -> list[str]:
    """The terminal's lines: every slot's answer, where the TOML file is, the search's summary and,
    on one GPU, the estimates at more GPUs."""
    rec = record(run)
    if rec is None:
        return []
    found = found_best.answers(run) if found is None else found
    out: list[str] = []
    for b in found:
        out += answer_lines(b)
    if toml is not None:
        out.append(f"measure it again: parbench run --config {toml}")
    out.append(summary(rec))
    est = estimates(run, found)
    if est is not None:
        out.append(f"estimates at more GPUs of this kind for {est[0]}'s best (not measured): "
                   f"{scaleout.line(est[1])}; assumes {scaleout.ASSUMES}")
    return out


def section(run: Run) -> dict[str, Any] | None:
    """The report's search section: answers, the knobs, the stages, the pruned candidates by reason
    (the first 40 listed), the wider search's minutes and the estimates; None without a search."""
    rec = record(run)
    if rec is None:
        return None
    found = found_best.answers(run)
    est = estimates(run, found)
    pruned = rec.get("pruned", [])
    return {"answers": [answer_lines(b) for b in found], "summary": summary(rec), "knobs": rec.get("knobs", []),
            "stages": [f"stage {s['stage']}: {len(s['cells'])} new, {len(s['again'])} again, "
                       f"{s['cap_s']:g} s cap, {s['seconds']:g} s" for s in rec.get("stages", [])],
            "pruned": [(p["cell"], p.get("world_size"), p["reason"]) for p in pruned[:40]],
            "more_pruned": max(len(pruned) - 40, 0),
            "estimates": [(e.strategy, e.world_size, f"{e.step_ms[0]:.1f}-{e.step_ms[1]:.1f}",
                           f"{e.speedup[0]:.2f}-{e.speedup[1]:.2f}x", f"{e.comm_ms:.1f}") for e in est[1]]
            if est else [], "estimate_of": est[0] if est else "", "assumes": scaleout.ASSUMES}
