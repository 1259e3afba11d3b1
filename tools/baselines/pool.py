"""Pool the rounds of several ``interleave.py`` results, across device calls, and test them.

    python3 -m tools.baselines.pool RESULT... [--vs RESULT...] [--family F] [--world-size N] [--json]

A RESULT is an ``interleave.json``, a folder holding one, or a ``.tgz`` of run folders (as
``tools/device/device_run.sh`` returns them); ``ARCHIVE.tgz::TEXT``
keeps only the archive's ``interleave.json`` members whose path contains TEXT (``pass.tgz::pass-end``).

One call affords 3-5 rounds, too few for a rank test to reach significance (``interleave.py``'s
docstring), so ``interleave.py`` reads each call against the plain loop's own spread instead. Pooling
the calls that measured the same configuration gives the test its rounds. Each round is paired
within its own call, harness against the plain loop of the same round, exactly as ``interleave.py``
pairs them (rounds whose two sides trained different global batches are left out). Per family and
world size it prints:

* ``n``: the pooled rounds, and ``calls``: the results they came from;
* the median of the per-round ratios (harness / plain), with min and max;
* the geometric mean of the ratios with a 95% t-interval over the log ratios (rounds taken as
  independent: each is a fresh launch of both sides);
* ``p``: the two-sided Wilcoxon signed-rank test of the log ratios against 0 (exact for small n):
  is the harness systematically slower or faster than its plain loop;
* ``h>p``: the rounds in which the harness was slower; ``floor``: the largest plain spread
  (``max / min - 1`` of its round medians) of any single call, the machine's own movement.

With ``--vs``, a second set is tabled the same way and each family's log ratios of the two sets are
compared with a two-sided Mann-Whitney U test (did the condition that differs between the sets,
e.g. ``--profile-at``, change the ratio?).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tarfile
from pathlib import Path

from tools.baselines import interleave


class BadInput(ValueError):
    """A result that cannot be read; the message names it and the fix."""


MAX_BYTES = 256 * 2**20  # an interleave.json is kilobytes; anything this large is not one
SETTINGS = ("workload", "dims", "global_batch", "steps", "warmup", "device", "backend", "harness_profile_steps",
            "harness_profile_at", "harness_adaptive", "launcher")  # interleave.py's args a pooled set should share


def _load_json(data: bytes, where: str) -> dict:
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError) as e:
        raise BadInput(f"{where} is not JSON ({e.__class__.__name__}): pass an interleave.json") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("runs"), list):
        raise BadInput(f"{where} has no 'runs' list: it is not an interleave.py result")
    return doc


def load(spec: str) -> list[tuple[str, dict]]:
    """(name, document) of every interleave result ``spec`` names (see the module docstring)."""
    path_text, _, member = spec.partition("::")
    path = Path(path_text)
    if not path.exists():
        raise BadInput(f"result {path_text!r} does not exist: pass an interleave.json, its folder or a .tgz")
    if path.is_dir():
        path = path / "interleave.json"
        if not path.is_file():
            raise BadInput(f"folder {path_text!r} holds no interleave.json")
    if not path.is_file():
        raise BadInput(f"result {path_text!r} is not a regular file: pass an interleave.json, its folder or a .tgz")
    if path.stat().st_size > MAX_BYTES:
        raise BadInput(f"result {path_text!r} is {path.stat().st_size / 2**20:.0f} MiB: not an interleave result")
    if path.name.endswith((".tgz", ".tar.gz")):
        try:
            with tarfile.open(path) as tar:
                out = []
                for m in sorted(tar.getmembers(), key=lambda m: m.name):
                    if m.isfile() and m.name.endswith("interleave.json") and member in m.name:
                        where = f"{path_text}::{m.name}"
                        if m.size > MAX_BYTES:
                            raise BadInput(f"{where} is {m.size / 2**20:.0f} MiB: not an interleave result")
                        out.append((where, _load_json(tar.extractfile(m).read(), where)))
        except (tarfile.TarError, OSError, EOFError) as e:
            first = str(e).splitlines()[0] if str(e) else e.__class__.__name__
            raise BadInput(f"{path_text!r} is not a readable .tgz ({first})") from None
        if not out:
            what = f" whose path contains {member!r}" if member else ""
            raise BadInput(f"{path_text!r} holds no interleave.json{what}")
        return out
    if member:
        raise BadInput(f"'::{member}' selects members of a .tgz; {path_text!r} is not one")
    return [(path_text, _load_json(path.read_bytes(), path_text))]


def _int(v, low: int) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= low else None


def _seconds(v) -> float | None:
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0
    return float(v) if ok else None


def clean(r) -> dict | None:
    """The fields interleave.py's table reads, checked, from one run record; None if it is malformed
    (a wrong type, a non-finite or non-positive step time, a side that is neither harness nor plain)."""
    if not isinstance(r, dict) or r.get("side") not in ("harness", "plain") or not isinstance(r.get("ok"), bool):
        return None
    rnd, ws, fam = _int(r.get("round"), 0), _int(r.get("world_size"), 1), r.get("family")
    if rnd is None or ws is None or not isinstance(fam, str) or not fam:
        return None
    row = r.get("row")
    gb = r.get("global_batch", row.get("global_batch") if isinstance(row, dict) else None)
    if gb is not None and _int(gb, 1) is None:
        return None
    out = {"side": r["side"], "round": rnd, "family": fam, "world_size": ws, "ok": r["ok"], "global_batch": gb,
           "error": r["error"] if isinstance(r.get("error"), str) else ""}
    if r["ok"]:
        med, mean = _seconds(r.get("median_s")), _seconds(r.get("mean_s"))
        if med is None or mean is None:
            return None
        out.update(median_s=med, mean_s=mean)
    return out


def run_ids(doc: dict) -> set[str]:
    """The harness run ids a result holds (to refuse pooling one call twice)."""
    return {r["row"]["run_id"] for r in doc["runs"] if isinstance(r, dict) and isinstance(r.get("row"), dict)
            and isinstance(r["row"].get("run_id"), str)}


def malformed(doc: dict) -> int:
    """How many of a result's run records :func:`clean` leaves out."""
    return sum(clean(r) is None for r in doc["runs"])


def rounds_of(doc: dict, where: str = "result") -> list[dict]:
    """interleave.py's table rows of one result (its own pairing of rounds), malformed records left
    out; BadInput where one round has two records of the same side."""
    runs, seen = [], set()
    for c in filter(None, map(clean, doc["runs"])):
        key = (c["side"], c["round"], c["family"], c["world_size"])
        if c["ok"]:
            if key in seen:
                raise BadInput(f"{where} has two {c['side']} records for round {c['round'] + 1} of {c['family']} "
                               f"x{c['world_size']}: it is not one interleave.py call")
            seen.add(key)
        runs.append(c)
    state = interleave.State(args={}, runs=runs)
    fams = list(dict.fromkeys(r["family"] for r in runs))
    worlds = sorted({r["world_size"] for r in runs})
    return [row for row in interleave.table(state, fams, worlds) if row["n"]]


def check_distinct(results: list[tuple[str, dict]]) -> None:
    """BadInput where one result is named twice or two results hold the same harness run: a call's
    rounds pooled twice would count as independent evidence."""
    names: set[str] = set()
    owner: dict[str, str] = {}  # harness run id -> the result that holds it
    for name, doc in results:
        if name in names:
            raise BadInput(f"{name} is named twice: pool each call's rounds once")
        names.add(name)
        for rid in run_ids(doc):
            if rid in owner:
                raise BadInput(f"{owner[rid]} and {name} hold the same harness run {rid}: pool each call's rounds once")
            owner[rid] = name


def differing_settings(results: list[tuple[str, dict]]) -> dict[str, list]:
    """The interleave.py settings that are not the same in every pooled result."""
    args = [doc["args"] if isinstance(doc.get("args"), dict) else {} for _, doc in results]
    out = {}
    for k in SETTINGS:
        distinct = {json.dumps(a.get(k), sort_keys=True, default=str): a.get(k) for a in args}
        if len(distinct) > 1:
            out[k] = [distinct[j] for j in sorted(distinct)]
    return out


def pooled(results: list[tuple[str, dict]], family: str | None = None, world_size: int | None = None) -> list[dict]:
    """Per (family, world size): the pooled per-round ratios and their statistics."""
    from scipy import stats

    check_distinct(results)
    groups: dict[tuple[str, int], dict] = {}
    for name, doc in results:
        for row in rounds_of(doc, name):
            if (family and row["family"] != family) or (world_size and row["world_size"] != world_size):
                continue
            g = groups.setdefault((row["family"], row["world_size"]), {"ratios": [], "calls": [], "floors": []})
            g["ratios"] += row["ratios"]
            g["calls"].append(name)
            if row["plain_spread"] is not None:
                g["floors"].append(row["plain_spread"])
    out = []
    for (fam, ws), g in sorted(groups.items()):
        r = g["ratios"]
        logs = [math.log(x) for x in r]
        n = len(r)
        mean = sum(logs) / n
        row = {"family": fam, "world_size": ws, "n": n, "calls": g["calls"], "ratios": r,
               "ratio_median": statistics.median(r), "ratio_min": min(r), "ratio_max": max(r),
               "geomean": math.exp(mean), "geomean_ci": None, "p_wilcoxon": None,
               "rounds_harness_slower": sum(x > 1 for x in r), "floor": max(g["floors"], default=None)}
        if n >= 2:
            sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / (n - 1))
            half = stats.t.ppf(0.975, n - 1) * sd / math.sqrt(n)
            row["geomean_ci"] = (math.exp(mean - half), math.exp(mean + half))
        if n >= 2 and any(x != 0 for x in logs):  # zeros (equal sides) ranked, not dropped (Pratt)
            row["p_wilcoxon"] = float(stats.wilcoxon(logs, zero_method="pratt").pvalue)
        out.append(row)
    return out


def compare(a: list[dict], b: list[dict]) -> list[dict]:
    """Per family present in both sets: the Mann-Whitney U p of their log ratios."""
    from scipy import stats

    bb = {(r["family"], r["world_size"]): r for r in b}
    out = []
    for r in a:
        o = bb.get((r["family"], r["world_size"]))
        if o is None or r["n"] < 2 or o["n"] < 2:
            continue
        x, y = [math.log(v) for v in r["ratios"]], [math.log(v) for v in o["ratios"]]
        exact = len(set(x + y)) == len(x + y)  # the exact distribution where there are no ties
        p = stats.mannwhitneyu(x, y, alternative="two-sided", method="exact" if exact else "asymptotic").pvalue
        out.append({"family": r["family"], "world_size": r["world_size"], "geomean": r["geomean"],
                    "vs_geomean": o["geomean"], "p_mannwhitney": float(p)})
    return out


def print_rows(title: str, rows: list[dict]) -> None:
    f3 = lambda v: f"{v:6.3f}" if v is not None else f"{'-':>6s}"  # noqa: E731
    print(title)
    print(f"{'family':16s} {'ws':>3s} {'n':>3s} {'calls':>5s} {'median':>6s} {'[min,':>7s} {'max]':>6s} "
          f"{'geomean':>7s} {'[95% CI]':>15s} {'p':>6s} {'h>p':>5s} {'floor':>6s}")
    for r in rows:
        ci = f"{r['geomean_ci'][0]:6.3f} {r['geomean_ci'][1]:6.3f}" if r["geomean_ci"] else f"{'-':>13s}"
        fl = f"{r['floor']:6.1%}" if r["floor"] is not None else f"{'-':>6s}"
        print(f"{r['family']:16s} {r['world_size']:3d} {r['n']:3d} {len(r['calls']):5d} {f3(r['ratio_median'])} "
              f"[{f3(r['ratio_min'])} {f3(r['ratio_max'])}] {r['geomean']:7.3f} [{ci}] {f3(r['p_wilcoxon'])} "
              f"{r['rounds_harness_slower']:2d}/{r['n']:<2d} {fl}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m tools.baselines.pool", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", nargs="+", metavar="RESULT", help="interleave.json, its folder, or ARCHIVE.tgz[::TEXT]")
    ap.add_argument("--vs", nargs="+", metavar="RESULT", default=[], help="a second set, compared with the first")
    ap.add_argument("--family", help="only this family")
    ap.add_argument("--world-size", type=int, help="only this world size")
    ap.add_argument("--json", action="store_true", help="print the pooled rows as JSON instead of tables")
    args = ap.parse_args(argv)
    if args.world_size is not None and args.world_size < 1:
        print(f"pool: --world-size {args.world_size} is not a world size: give 1 or more, or leave it out",
              file=sys.stderr)
        return 2
    try:
        set_a = [x for s in args.results for x in load(s)]
        set_b = [x for s in args.vs for x in load(s)]
        check_distinct(set_a + set_b)  # across the two sets too
        a = pooled(set_a, args.family, args.world_size)
        b = pooled(set_b, args.family, args.world_size) if set_b else []
    except BadInput as e:
        print(f"pool: {e}", file=sys.stderr)
        return 2
    left_out = {n: k for n, doc in set_a + set_b if (k := malformed(doc))}
    if not a:
        print("pool: no compared rounds in the results (every run failed, or the filters matched nothing)",
              file=sys.stderr)
        return 2
    cmp = compare(a, b) if b else []
    if set_b and not cmp:
        print("pool: the --vs set has no family and world size with 2 or more compared rounds in common with the "
              "first set: nothing to compare", file=sys.stderr)
        return 2
    notes = [f"{n}: {k} malformed record(s) left out" for n, k in left_out.items()]
    for label, results in (("results", set_a), ("--vs results", set_b)):
        diff = differing_settings(results) if len(results) > 1 else {}
        if diff:
            notes.append(f"the pooled {label} differ in " + "; ".join(f"{k} {v}" for k, v in diff.items()))
    if args.json:
        json.dump({"set": a, "vs": b, "compare": cmp, "notes": notes}, sys.stdout, indent=1)
        print()
        return 0
    print_rows("harness / plain, pooled rounds" + (" (first set)" if b else ""), a)
    if b:
        print()
        print_rows("harness / plain, pooled rounds (--vs set)", b)
        print()
        for c in cmp:
            print(f"{c['family']} x{c['world_size']}: geomean {c['geomean']:.3f} vs {c['vs_geomean']:.3f}, "
                  f"Mann-Whitney U p = {c['p_mannwhitney']:.3f}")
    for n in notes:
        print(f"note: {n}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

