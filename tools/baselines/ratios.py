"""interleave.py's records tabled: harness / plain ratios per family and world size, and their noise verdict.

Per family and world size: the harness median step time (median over rounds of the cell's
``step_time_median_s``), the plain median (same, of the JSON line's), the ratio harness / plain
(median over rounds of the per-round ratio, with min-max, and the same on means), and a noise
verdict. ``pool.py`` tables pooled results with the same :func:`table`.

Noise verdict. Per family and world size the table also gives (a) the plain side's own
round-to-round spread, ``max / min - 1`` of its per-round medians over the compared rounds: the
floor a ratio can be read against (the plain loop does not change between rounds, so whatever it
moves is the machine); (b) how many rounds had harness > plain; (c) a verdict:

* ``within 1%``: every per-round ratio lies in [0.99, 1.01];
* ``harness slower``: every round's ratio is above 1 and the median ratio exceeds 1 by more than
  the plain spread;
* ``harness faster``: every round's ratio is below 1 and the median ratio falls short of 1 by more
  than the plain spread;
* ``inside noise (floor X%)``: anything else, X the plain spread;
* ``too few rounds``: fewer than 2 compared rounds (one round has no spread to read against).

That is all the statistics here, on purpose: with the 3-5 rounds a call can afford, a rank test of
harness against plain cannot reach significance (with n = 3 pairs the smallest two-sided
Wilcoxon signed-rank p-value is 0.25, with n = 5 it is 0.0625), so a test would only ever say "not
significant"; the rule above says instead whether the effect is larger than what the machine
itself moved. For a resolved 1% the regression gate (``parbench compare``) with more repeats is
the tool; ``tools/baselines/pool.py`` pools the rounds of several calls of ``interleave.py`` (the same
configuration measured again) and tests them (Wilcoxon signed-rank, a t-interval of the geometric
mean, Mann-Whitney U between two conditions).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

from tools.baselines.pairs import family_worlds

TOLERANCE = 0.01  # "within 1%": every per-round ratio in [1 - TOLERANCE, 1 + TOLERANCE]


@dataclass
class State:
    """Everything measured so far; written to the JSON file after every run."""

    args: dict
    runs: list[dict] = field(default_factory=list)
    t0: float = field(default_factory=time.monotonic)
    dropped: dict[str, list[str]] = field(default_factory=dict)

    def elapsed(self) -> float:
        return time.monotonic() - self.t0


def global_batch_of(rec: dict) -> int | None:
    """The global batch a run reports (its record's, else its row's); None for older results."""
    gb = rec.get("global_batch", (rec.get("row") or {}).get("global_batch"))
    return None if gb is None else int(gb)


def knobs_of(rec: dict) -> dict[str, str]:
    """The training knobs a run's row reports (the harness row's ``compile`` is off/on, the plain
    line's a boolean), those it reports: older rows have none."""
    row = rec.get("row") or {}
    out = {k: str(row[k]) for k in ("optimizer", "ac") if row.get(k) is not None}
    if row.get("compile") is not None:
        out["compile"] = "on" if row["compile"] in (True, "on") else "off"
    return out


def mismatch(h: dict, p: dict) -> str | None:
    """Why a round's harness and plain records do not compare (a different global batch, a knob set
    differently, e.g. a run flag the harness went without), or None. A field one side lacks is
    taken as matching (older results)."""
    gh, gp = global_batch_of(h), global_batch_of(p)
    if gh is not None and gp is not None and gh != gp:
        return f"global batch harness {gh} != plain {gp}"
    kh, kp = knobs_of(h), knobs_of(p)
    diff = [f"{k} harness {kh[k]} != plain {kp[k]}" for k in kh if k in kp and kh[k] != kp[k]]
    return ", ".join(diff) or None


def verdict(ratios: list[float], plain_spread: float | None, *, tolerance: float = TOLERANCE,
            side: str = "harness") -> str:
    """The noise verdict of one family's per-round ratios (``side`` / plain) against the plain side's
    round-to-round spread (module docstring: the rule and why nothing more). ``tolerance`` and
    ``side`` let other A/B scripts use the same rule (the two-agent run: 5%, "two agents")."""
    if len(ratios) < 2 or plain_spread is None:
        return "too few rounds"
    if all(1 - tolerance <= r <= 1 + tolerance for r in ratios):
        return f"within {tolerance:.0%}"
    med = statistics.median(ratios)
    if all(r > 1 for r in ratios) and med - 1 > plain_spread:
        return f"{side} slower"
    if all(r < 1 for r in ratios) and 1 - med > plain_spread:
        return f"{side} faster"
    return f"inside noise (floor {plain_spread:.1%})"


def table(state: State, families: list[str], worlds: list[int]) -> list[dict]:
    """Per family and world size: medians over rounds, the per-round ratio's median and range, the
    plain side's round-to-round spread, the rounds harness > plain and the noise verdict. A round
    whose sides report different global batches or training knobs is left out (noted)."""
    out = []
    for w in worlds:
        for fam in families:
            if w not in family_worlds(fam, worlds):
                continue  # a one-device family has no row beyond world size 1
            by = {(r["side"], r["round"]): r for r in state.runs
                  if r["family"] == fam and r["world_size"] == w and r["ok"]}
            paired = sorted({k[1] for k in by if ("harness", k[1]) in by and ("plain", k[1]) in by})
            rounds, notes = [], []
            for k in paired:
                why = mismatch(by["harness", k], by["plain", k])
                if why:
                    notes.append(f"round {k + 1} not compared: {why}")
                else:
                    rounds.append(k)
            gbs = sorted({g for k in rounds for side in ("harness", "plain")
                          if (g := global_batch_of(by[side, k])) is not None})
            h = [by["harness", k]["median_s"] for k in rounds]
            p = [by["plain", k]["median_s"] for k in rounds]
            ratios = [a / b for a, b in zip(h, p)]
            mean_ratios = [by["harness", k]["mean_s"] / by["plain", k]["mean_s"] for k in rounds]
            fails = [r.get("error", "")[:120] for r in state.runs
                     if r["family"] == fam and r["world_size"] == w and not r["ok"]]
            spread = max(p) / min(p) - 1 if len(p) >= 2 else None
            out.append({"family": fam, "world_size": w, "n": len(rounds), "global_batch": gbs,
                        "harness_median_s": statistics.median(h) if h else None,
                        "plain_median_s": statistics.median(p) if p else None,
                        "ratio_median": statistics.median(ratios) if ratios else None,
                        "ratio_min": min(ratios, default=None), "ratio_max": max(ratios, default=None),
                        "ratio_of_means_median": statistics.median(mean_ratios) if mean_ratios else None,
                        "ratios": ratios, "plain_spread": spread,
                        "rounds_harness_slower": sum(r > 1 for r in ratios),
                        "verdict": verdict(ratios, spread), "round_notes": notes,
                        "harness_options_dropped": state.dropped.get(fam, []), "failures": fails})
    return out


def print_table(rows: list[dict]) -> None:
    ms = lambda v: f"{v * 1e3:10.2f}" if v is not None else f"{'-':>10s}"  # noqa: E731
    rt = lambda v: f"{v:6.3f}" if v is not None else f"{'-':>6s}"  # noqa: E731
    pc = lambda v: f"{v:6.1%}" if v is not None else f"{'-':>6s}"  # noqa: E731
    print(f"\n{'family':16s} {'ws':>3s} {'n':>2s} {'gb':>4s} {'harness ms':>10s} {'plain ms':>10s} {'ratio':>6s} "
          f"{'[min,':>7s} {'max]':>6s} {'means':>6s} {'floor':>6s} {'h>p':>4s}  {'verdict':26s} notes")
    for r in rows:
        notes = "; ".join(filter(None, [f"harness options dropped {r['harness_options_dropped']}"
                                        if r["harness_options_dropped"] else "",
                                        f"{len(r['failures'])} run(s) failed" if r["failures"] else "",
                                        *r.get("round_notes", [])]))
        gb = "/".join(map(str, r.get("global_batch") or [])) or "-"
        print(f"{r['family']:16s} {r['world_size']:3d} {r['n']:2d} {gb:>4s} {ms(r['harness_median_s'])} "
              f"{ms(r['plain_median_s'])} {rt(r['ratio_median'])} [{rt(r['ratio_min'])} {rt(r['ratio_max'])}] "
              f"{rt(r['ratio_of_means_median'])} {pc(r.get('plain_spread'))} "
              f"{r.get('rounds_harness_slower', 0):2d}/{r['n']:<1d}  {r.get('verdict', ''):26s} {notes}", flush=True)
