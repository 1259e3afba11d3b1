"""Harness vs plain loop, interleaved on the same GPUs in one call: the harness's overhead table.

    PYTHONPATH=. python3 tools/baselines/interleave.py --quick               # smoke: 1 round, x2, 5 steps, ~3 min
    PYTHONPATH=. python3 tools/baselines/interleave.py --world-sizes 2 --families ddp,fsdp,pipeline-gpipe,pipeline-1f1b
    PYTHONPATH=. python3 tools/baselines/interleave.py --world-sizes 4 --families tensor,tensor-sp

(All six default families at x2 and x4 with 3 rounds take ~18 min of device time, more than one
600 s command: split the call by world size and family, as above; the script prints its estimate.)

Each round runs, for every world size, the harness cells (A: ``python3 -m bench run ...``) and
the plain programs (B: ``tools/baselines/plain_*.py``) of every family, A then B, and rounds repeat,
so both sides see the same machine state over the call. By default the harness cells of a round
that can share one ``parbench run`` do (the harness adds a one-GPU reference cell and starts one
torchrun per world size on every call, ~10 s each); ``--pairwise`` runs one harness call per family
and world size instead, right before its plain program (stricter A B, slower).

Per family and world size it prints the harness median step time (median over rounds of the
cell's ``step_time_median_s``), the plain median (same, of the JSON line's), and the ratio
harness / plain (median over rounds of the per-round ratio, with min-max). Every raw result (the
commands, the harness row, the plain line, wall times, failures) goes to ``$OUT/interleave.json``,
rewritten after every run, and the harness run folders to ``$OUT/interleave-runs/``.

The harness is held to exactly ``--warmup`` and ``--steps`` (its ``--warmup-max``/``--steps-max``),
as the plain programs run; ``--harness-adaptive`` lets it extend both until the step time settles.
``--deadline-s`` (default 560, under the device tool's 600 s a command) stops starting runs that
would not finish in time; what finished is still tabled. Edit ``PAIRS`` below when harness options
change: an option the checkout's strategy does not declare is dropped with a warning (the harness
refuses unknown options), and the table says so.

``--global-batch N`` and ``--dims K=V[,K=V]`` go to both sides alike: the harness gets
``--global-batch N`` and the workload as ``NAME[K=V,...]`` (its own syntax for dimensions), the
plain programs ``--global-batch N --dims K=V,...`` (``_common.setup`` resolves the workload with
them), so both build the same model on the same batches. Both sides record the global batch they
trained (the harness row's ``global_batch``, the plain line's); a round whose two sides report
different global batches is not compared (the table notes it). A record without the field (older
results) is taken as matching. E.g. ``--global-batch 64`` on 2 GPUs makes gpt-200m's steps
GPU-bound where the default 16 leaves them CPU-launch-bound, with a round-to-round noise of tens of
percent on the lent hosts.

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
the tool; ``tools/baselines/pool.py`` pools the rounds of several calls of this script (the same
configuration measured again) and tests them (Wilcoxon signed-rank, a t-interval of the geometric
mean, Mann-Whitney U between two conditions).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run as a script: make `bench` and `strategies` importable
    sys.path.insert(0, str(ROOT))

from bench.cli.common import report_interrupt  # noqa: E402
from bench.core import backends  # noqa: E402
from bench.runtime.process import child_env, free_port, run_ranks, run_tree, torchrun_cmd  # noqa: E402
from bench.runtime.signals import install_stop_handlers, restore_stop_handlers  # noqa: E402


@dataclass(frozen=True)
class Pair:
    """One family: the harness cell (strategy and ``--option``s) and the plain program (module, flags)."""

    strategy: str
    options: tuple[str, ...]
    program: str
    flags: tuple[str, ...] = ()
    row_name: str | None = None  # the cells' `strategy` column, where ``strategy`` is a module:Class spec

    @property
    def cell(self) -> str:
        return self.row_name or self.strategy


# ---- the pairs: edit here ------------------------------------------------------------------------
# Harness options as declared by the strategies (each configured as its documentation does); the plain
# flags state the same configuration. Pipelines: 8 micro-batches and equal transformer blocks per stage
# on both sides (the harness's default pp_balance=blocks).
PAIRS: dict[str, Pair] = {
    "ddp": Pair("ddp", (), "plain_ddp"),                                       # DDP defaults both sides
    "ddp-tuned": Pair("ddp", ("bucket_mb=100", "ddp_grad_as_bucket_view=true", "ddp_static_graph=true"),
                      "plain_ddp", ("--bucket-mb", "100", "--grad-as-bucket-view", "--static-graph")),
    "fsdp": Pair("fsdp", ("fsdp_mp=auto",), "plain_fsdp"),                    # bf16 params, fp32 reduce
    "fsdp-fp32": Pair("fsdp", ("fsdp_mp=off",), "plain_fsdp", ("--no-mp",)),  # fp32 params + autocast
    "fsdp-noreshard": Pair("fsdp-noreshard", ("fsdp_mp=auto",), "plain_fsdp", ("--no-reshard",)),
    "pipeline-gpipe": Pair("pipeline-gpipe", ("micro_batches=8",), "plain_pipeline",
                           ("--schedule", "gpipe", "--micro-batches", "8", "--split", "equal")),
    "pipeline-1f1b": Pair("pipeline-1f1b", ("micro_batches=8",), "plain_pipeline",
                          ("--schedule", "1f1b", "--micro-batches", "8", "--split", "equal")),
    # Both plans by their strategies' defaults (tensor: megatron; variants.TensorSP: sp), so the two
    # share a harness call (an --option tp_plan=... would apply to both).
    "tensor": Pair("tensor", (), "plain_tp"),                                 # no sequence parallel
    "tensor-sp": Pair("tools.baselines.variants:TensorSP", (), "plain_tp", ("--sequence-parallel",),
                      row_name="tensor-sp"),
}
DEFAULT_FAMILIES = "ddp,fsdp,pipeline-gpipe,pipeline-1f1b,tensor,tensor-sp"
# Environment for both sides, as tools/device/device_run.sh (NVLink multicast off on lent machines).
GPU_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1",
           "PYTHONUNBUFFERED": "1"}
# ---------------------------------------------------------------------------------------------------
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


def log(state: State, msg: str) -> None:
    print(f"[{state.elapsed():5.0f}s] {msg}", flush=True)


def declared_options(strategy: str) -> dict | None:
    """The options the checkout's harness strategy declares, by name (None: cannot tell)."""
    try:
        import strategies

        return {o.name: o for o in getattr(strategies.get(strategy), "options", ())}
    except Exception:  # noqa: BLE001 - the tree may be mid-refactor; the harness itself will judge
        return None


def effective_options(family: str, pair: Pair, state: State) -> tuple[str, ...]:
    """The pair's options less those the harness would refuse, undeclared or of a wrong value
    (recorded as dropped, with a warning)."""
    known = declared_options(pair.strategy)
    if known is None:
        return pair.options
    keep, dropped = [], []
    for opt in pair.options:
        key, _, value = opt.partition("=")
        try:
            if key not in known:
                raise ValueError("not declared")
            if hasattr(known[key], "parse"):
                known[key].parse(value)
            keep.append(opt)
        except ValueError as e:
            dropped.append(f"{opt} ({e})")
    if dropped and family not in state.dropped:
        state.dropped[family] = dropped
        print(f"WARNING {family}: harness strategy {pair.strategy!r} refuses {dropped}; dropped "
              f"(edit PAIRS in {Path(__file__).name})", flush=True)
    return tuple(keep)


def harness_groups(families: list[str], state: State) -> list[list[str]]:
    """Families whose harness cells can share one ``parbench run``. ``--option`` applies to every
    cell of a run, so members need distinct strategies, and every option a member's strategy
    declares must have the value that member asked for (or be unset by all, for its default)."""
    opts = {f: dict(o.split("=", 1) for o in effective_options(f, PAIRS[f], state)) for f in families}
    keys = {f: set(declared_options(PAIRS[f].strategy) or opts[f]) for f in families}

    def compatible(members: list[str], fam: str) -> bool:
        group = [*members, fam]
        if len({PAIRS[m].strategy for m in group}) < len(group):
            return False
        merged: dict[str, str] = {}
        for m in group:
            for k, v in opts[m].items():
                if merged.setdefault(k, v) != v:
                    return False
        return all(opts[m].get(k) == merged[k] for m in group for k in merged if k in keys[m])

    groups: list[list[str]] = []
    for fam in families:
        for members in groups:
            if compatible(members, fam):
                members.append(fam)
                break
        else:
            groups.append([fam])
    return groups


def env_for(world: int, args: argparse.Namespace, *, ranks: bool = True) -> dict[str, str]:
    """The environment of a launch on ``world`` GPUs: the runtime's rank environment
    (:func:`bench.runtime.process.child_env`: the harness gives its own ranks the same, so the two
    sides differ in nothing but the code under test), this checkout importable, the first ``world``
    GPUs visible. ``ranks=False`` for a ``parbench`` command, which sets its ranks' threads itself."""
    env = child_env(world, path=[str(ROOT)], threads=ranks, defaults=GPU_ENV if args.device == "cuda" else None)
    if args.device == "cuda":
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, range(world)))  # the first GPUs, both sides
    return env


def run_harness(fams: list[str], worlds: list[int], rnd: int, args: argparse.Namespace, state: State) -> None:
    """One ``parbench run`` of these families at these world sizes; one record per (family, world)."""
    import pandas as pd

    out = Path(args.runs_dir) / f"r{rnd}-{'+'.join(fams)}-x{'+'.join(map(str, worlds))}"
    opts = sorted({o for f in fams for o in effective_options(f, PAIRS[f], state)})
    cmd = [sys.executable, "-m", "bench", "run", "--no-progress", "--device", args.device,
           "--backends", args.backend, "--workloads", harness_workload(args),
           "--strategies", ",".join(dict.fromkeys(PAIRS[f].strategy for f in fams)),
           "--world-sizes", ",".join(map(str, worlds)), "--steps", str(args.steps), "--warmup", str(args.warmup),
           "--profile-steps", str(args.harness_profile_steps), "--sample-hz", "0",
           *(["--profile-at", args.harness_profile_at] if args.harness_profile_at else []),
           "--cell-timeout", str(args.run_timeout_s),
           "--out", str(out), *[a for o in opts for a in ("--option", o)], *pin_flags(args),
           *(["--global-batch", str(args.global_batch)] if args.global_batch else [])]
    t = time.monotonic()
    p = run_tree(cmd, cwd=ROOT, env=env_for(max(worlds), args, ranks=False),
                 timeout_s=args.run_timeout_s * (2 + len(fams) * len(worlds)))
    wall = time.monotonic() - t
    cells = None
    found = sorted(out.glob("*/cells.parquet"))
    if found:
        cells = pd.read_parquet(found[-1])
    for fam in fams:
        for w in worlds:
            rec = {"side": "harness", "round": rnd, "family": fam, "world_size": w, "cmd": cmd, "wall_s": wall,
                   "rc": p.returncode, "ok": False}
            rows = None if cells is None else cells[(cells.strategy == PAIRS[fam].cell) & (cells.world_size == w)]
            if rows is not None and len(rows):
                row = json.loads(rows.iloc[0].to_json())
                rec["row"] = row
                rec["ok"] = row.get("status") == "ok"
                rec["median_s"], rec["mean_s"] = row.get("step_time_median_s"), row.get("step_time_mean_s")
                rec["global_batch"] = row.get("global_batch")
                if not rec["ok"]:
                    rec["error"] = f"status {row.get('status')}: {row.get('reason')}"
            else:
                rec["error"] = f"no cell (rc {p.returncode}): {p.stderr[-1500:] or p.stdout[-1500:]}"
            state.runs.append(rec)
            log(state, f"round {rnd + 1} harness {fam:15s} x{w}: " +
                (f"median {rec['median_s'] * 1e3:8.2f} ms" if rec["ok"] else f"FAILED {rec['error'][:300]}"))
    log(state, f"round {rnd + 1} harness call ({'+'.join(fams)} x{'+'.join(map(str, worlds))}) took {wall:.0f}s")


def cli_help(args: argparse.Namespace) -> str:
    """``parbench run --help`` of this checkout (asked once): which flags its harness takes."""
    if not hasattr(args, "_cli_help"):
        p = run_tree([sys.executable, "-m", "bench", "run", "--help"], cwd=ROOT, env=env_for(1, args, ranks=False),
                     timeout_s=None)
        args._cli_help = p.stdout
    return args._cli_help


def pin_flags(args: argparse.Namespace) -> list[str]:
    """Flags that hold the harness to exactly --warmup and --steps, as the plain programs run (the
    harness otherwise extends both until the step time settles); none where the checkout's CLI
    has no such flags, or with --harness-adaptive."""
    if args.harness_adaptive:
        return []
    text = cli_help(args)
    flags = []
    if "--warmup-max" in text:
        flags += ["--warmup-max", str(args.warmup)]
    if "--steps-max" in text:
        flags += ["--steps-max", str(args.steps)]
    if "--budget" in text:  # a default budget would plan its own steps (seen on GPU: 2 to 500)
        flags += ["--budget", "off"]
    return flags


def parse_dims(text: str) -> dict[str, int]:
    """``n_layer=4,d_model=128`` -> ``{"n_layer": 4, "d_model": 128}`` (integers, as both sides take),
    read by the harness's own parser of ``NAME[K=V,...]``."""
    from bench.core.config import parse_workload
    from bench.core.errors import UserError

    try:
        dims = parse_workload(f"w[{text}]")[1] if text.strip() else {}
    except UserError:
        raise SystemExit(f"--dims {text!r}: expected KEY=<integer>[,...], e.g. --dims n_layer=4,d_model=128") from None
    if "global_batch" in dims:
        raise SystemExit("--dims global_batch=...: give the global batch as --global-batch N")
    return dims


def harness_workload(args: argparse.Namespace) -> str:
    """The workload as the harness's ``--workloads`` takes it: ``NAME[K=V,...]`` with ``--dims``."""
    dims = args.dims_parsed
    return args.workload if not dims else f"{args.workload}[{','.join(f'{k}={v}' for k, v in dims.items())}]"


def workload_flags(args: argparse.Namespace) -> list[str]:
    """The same workload, global batch and dimensions as the plain programs' flags."""
    dims = args.dims_parsed
    return (["--workload", args.workload]
            + (["--global-batch", str(args.global_batch)] if args.global_batch else [])
            + (["--dims", ",".join(f"{k}={v}" for k, v in dims.items())] if dims else []))


def check_batch(args: argparse.Namespace, families: list[str], worlds: list[int]) -> None:
    """Refuse, before any run, what would fail on one side only: a harness without
    ``--global-batch`` (the plain side alone would change its batch), a global batch the data-parallel
    ranks or a pipeline's micro-batches do not divide."""
    if args.global_batch is None:
        return
    if args.global_batch < 1:
        raise SystemExit(f"--global-batch {args.global_batch} must be >= 1")
    if "--global-batch" not in cli_help(args):
        raise SystemExit("--global-batch: this checkout's `parbench run` has no --global-batch flag, so only the "
                         "plain side would change its batch; run without it")
    gb = args.global_batch
    for fam in families:
        pair = PAIRS[fam]
        if pair.program in ("plain_ddp", "plain_fsdp"):
            bad = [w for w in worlds if gb % w]
            if bad:
                raise SystemExit(f"--global-batch {gb}: {fam} shares it over the ranks; {bad} do not divide it")
        if pair.program == "plain_pipeline":
            m = int(pair.flags[pair.flags.index("--micro-batches") + 1]) if "--micro-batches" in pair.flags else 8
            if gb % m:
                raise SystemExit(f"--global-batch {gb}: {fam} cuts it into {m} micro-batches; {m} does not divide it")


def launch(module: str, flags: list[str], world: int, args: argparse.Namespace,
           timeout: float | None = None) -> tuple[int, str, str]:
    """(return code, rank 0's stdout, the ranks' stderr) of ``world`` ranks of ``module``, started
    directly with the variables torchrun would set (:func:`bench.runtime.process.run_ranks`: it
    spares the launcher's own start-up), or through torchrun with ``--launcher torchrun``; either
    way a timeout or a stop kills every rank's tree."""
    env = env_for(world, args)
    timeout = timeout or args.run_timeout_s
    if args.launcher == "torchrun":
        p = run_tree(torchrun_cmd(flags, world, module=module), cwd=ROOT, env=env, timeout_s=timeout)
        return p.returncode, p.stdout, p.stderr
    return run_ranks(module, flags, world, cwd=ROOT, env=env, timeout_s=timeout)


def by_program(out: str, n: int) -> list[dict | None]:
    """Program k's last JSON line (its result, or plain_many's error line) from a launch's stdout:
    ``plain_many`` marks where each program starts; a lone program's lines are all its own."""
    found: list[dict | None] = [None] * n
    k = 0
    for text in out.splitlines():
        if not text.startswith("{"):
            continue
        line = json.loads(text)
        if "plain_many_index" in line:
            k = int(line["plain_many_index"])
        elif k < n:
            found[k] = line
    return found


def run_plain(fams: list[str], world: int, rnd: int, args: argparse.Namespace, state: State) -> None:
    """The plain programs of these families at one world size; one record each. With
    ``--separate-plain`` (or one family) each program is its own launch; otherwise one launch of
    ``plain_many`` runs them in turn (each its own process group and JSON line, the interpreter and
    CUDA context paid once)."""
    flags = {f: ["--device", args.device, "--backend", args.backend, *workload_flags(args),
                 "--steps", str(args.steps), "--warmup", str(args.warmup), *PAIRS[f].flags] for f in fams}
    batches = [[f] for f in fams] if (args.separate_plain or len(fams) == 1) else [fams]
    for batch in batches:
        if len(batch) == 1:
            module, mflags = f"tools.baselines.{PAIRS[batch[0]].program}", flags[batch[0]]
        else:
            module = "tools.baselines.plain_many"
            mflags = ["--ports", ",".join(str(free_port()) for _ in batch)]
            for f in batch:
                mflags += ["--program", shlex.join([PAIRS[f].program, *flags[f]])]
        t = time.monotonic()
        try:
            rc, out, err = launch(module, mflags, world, args, timeout=args.run_timeout_s * len(batch))
        except subprocess.TimeoutExpired:
            rc, out, err = 124, "", "timeout"
        wall = time.monotonic() - t
        lines = by_program(out, len(batch))
        for k, fam in enumerate(batch):
            rec = {"side": "plain", "round": rnd, "family": fam, "world_size": world,
                   "cmd": [PAIRS[fam].program, *flags[fam]], "launcher": args.launcher,
                   "batched_with": batch if len(batch) > 1 else None, "wall_s": wall, "rc": rc, "ok": False}
            line = lines[k]
            if line is not None and "step_time_median_s" in line:
                rec.update(ok=True, row=line, median_s=line["step_time_median_s"], mean_s=line["step_time_mean_s"],
                           global_batch=line.get("global_batch"))
            else:
                rec["error"] = (f"{line['plain_many_error']}" if line else f"rc {rc}: no result line") + \
                    f"; stderr: {err[-1200:]}"
            state.runs.append(rec)
            log(state, f"round {rnd + 1} plain   {fam:15s} x{world}: " +
                (f"median {rec['median_s'] * 1e3:8.2f} ms" if rec["ok"] else f"FAILED {rec['error'][-300:]}"))
        log(state, f"round {rnd + 1} plain call ({'+'.join(batch)} x{world}) took {wall:.0f}s")


def global_batch_of(rec: dict) -> int | None:
    """The global batch a run reports (its record's, else its row's); None for older results."""
    gb = rec.get("global_batch", (rec.get("row") or {}).get("global_batch"))
    return None if gb is None else int(gb)


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
    whose sides report different global batches is left out (noted)."""
    out = []
    for w in worlds:
        for fam in families:
            by = {(r["side"], r["round"]): r for r in state.runs
                  if r["family"] == fam and r["world_size"] == w and r["ok"]}
            paired = sorted({k[1] for k in by if ("harness", k[1]) in by and ("plain", k[1]) in by})
            rounds, notes = [], []
            for k in paired:
                gh, gp = global_batch_of(by["harness", k]), global_batch_of(by["plain", k])
                if gh is not None and gp is not None and gh != gp:
                    notes.append(f"round {k + 1} not compared: global batch harness {gh} != plain {gp}")
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


def save(state: State, path: Path, rows: list[dict] | None = None) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"args": state.args, "pairs": {k: vars(v) for k, v in PAIRS.items()},
                               "dropped_options": state.dropped, "table": rows, "runs": state.runs},
                              indent=1, default=str))
    tmp.replace(path)


def estimate_s(groups: list[list[str]], families: list[str], worlds: list[int], args: argparse.Namespace) -> float:
    """Device seconds the call will take, from a 4x H100 run (2026-11-26, gpt-200m): a harness
    torchrun ~20 s to start (one per world size plus one for the one-GPU reference cell) and ~3 s a
    cell besides its steps; a plain launch ~8 s, then ~4 s a program besides its steps; a step
    ~0.05-0.25 s (0.15 assumed)."""
    step = 0.15 * (args.steps + args.warmup)
    calls = ([(1, [w]) for _ in families for w in worlds] if args.pairwise
             else [(len(g), worlds) for g in groups])
    harness = sum(20 * (1 + len(ws)) + (step + 3) * (1 + n * len(ws)) for n, ws in calls)
    launches = len(families) if (args.pairwise or args.separate_plain) else len(groups)
    plain = len(worlds) * (launches * 8 + len(families) * (4 + step))
    return args.repeats * (harness + plain)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--families", default=DEFAULT_FAMILIES, help=f"comma list of {', '.join(PAIRS)}")
    ap.add_argument("--world-sizes", default="2,4")
    ap.add_argument("--repeats", type=int, default=3, help="rounds (each family and size once per round)")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--workload", default="gpt-200m")
    ap.add_argument("--global-batch", type=int, default=None, metavar="N",
                    help="both sides' global batch (harness --global-batch, plain --global-batch; default: the "
                         "workload's own)")
    ap.add_argument("--dims", default="", metavar="K=V[,K=V]",
                    help="workload dimensions for both sides (harness NAME[K=V,...], plain --dims)")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--backend", default=None, help="default: nccl on cuda, gloo on cpu")
    ap.add_argument("--quick", action="store_true", help="smoke run: 1 round, smallest world size, 5 steps")
    ap.add_argument("--harness-profile-steps", type=int, default=0,
                    help="the harness's --profile-steps (its default is 2: GPU-profiled steps, on CUDA in a pass "
                         "after every timed step of the group); 0 profiles one CPU-only step")
    ap.add_argument("--harness-profile-at", choices=("auto", "end", "inline"), default=None,
                    help="the harness's --profile-at (left out: its default, end on CUDA); inline profiles after "
                         "each cell's first repeat, in the processes that go on to time later cells")
    ap.add_argument("--pairwise", action="store_true", help="one harness call per family and size (strict A B)")
    ap.add_argument("--harness-adaptive", action="store_true",
                    help="let the harness extend warm-up and timed steps until the step time settles")
    ap.add_argument("--launcher", choices=("direct", "torchrun"), default="direct",
                    help="how the plain programs start (direct: the torchrun variables, no launcher process)")
    ap.add_argument("--fixed-order", action="store_true",
                    help="harness first in every round (default: harness first in even rounds, plain first in odd)")
    ap.add_argument("--separate-plain", action="store_true",
                    help="one launch per plain program (default: the plain programs of a harness group "
                         "run in turn in one launch of plain_many, paying the start-up once)")
    ap.add_argument("--deadline-s", type=float, default=560.0, help="start nothing that would end after this")
    ap.add_argument("--run-timeout-s", type=int, default=240)
    ap.add_argument("--out", default=os.environ.get("OUT", "."), help="folder for interleave.json (default $OUT)")
    args = ap.parse_args(argv)
    args.backend = args.backend or backends.default_for(args.device).name
    families = [f for f in args.families.split(",") if f]
    unknown = [f for f in families if f not in PAIRS]
    if unknown:
        raise SystemExit(f"unknown families {unknown}; known: {', '.join(PAIRS)}")
    worlds = [int(w) for w in args.world_sizes.split(",")]
    if args.quick:
        args.repeats, args.steps, args.warmup, worlds = 1, 5, 2, worlds[:1]
    args.dims_parsed = parse_dims(args.dims)
    check_batch(args, families, worlds)
    if args.device == "cuda":
        import torch

        if torch.cuda.device_count() < max(worlds):
            raise SystemExit(f"{torch.cuda.device_count()} GPU(s) visible, world sizes {worlds} need {max(worlds)}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    args.runs_dir = str(out / "interleave-runs")
    state = State(args={k: v for k, v in vars(args).items() if not k.startswith("_")}
                  | {"families": families, "world_sizes": worlds})
    path = out / "interleave.json"
    groups = [[f] for f in families] if args.pairwise else harness_groups(families, state)
    n_p = args.repeats * len(families) * len(worlds)
    est = estimate_s(groups, families, worlds, args)
    log(state, f"{len(families)} families x world sizes {worlds} x {args.repeats} rounds: {n_p} plain runs; "
               f"harness groups {groups}; about {est / 60:.1f} min on GPU (estimate); results -> {path}")
    if est > args.deadline_s:
        log(state, f"WARNING: the estimate exceeds --deadline-s {args.deadline_s:.0f}: later rounds will be cut; "
                   "split the call (by --world-sizes or --families)")
    longest = {"harness": 0.0, "plain": 0.0}

    def fits(kind: str) -> bool:
        ok = state.elapsed() + longest[kind] * 1.1 < args.deadline_s
        if not ok:
            log(state, f"deadline {args.deadline_s:.0f}s: not starting another {kind} run")
        return ok

    def timed(kind: str, run) -> bool:
        """Run one harness call or plain launch if it fits the deadline; False when it does not."""
        if not fits(kind):
            return False
        t = time.monotonic()
        run()
        longest[kind] = max(longest[kind], time.monotonic() - t)
        save(state, path)
        return True

    stop = False
    install_stop_handlers()  # SIGTERM and SIGHUP stop the call as Ctrl-C does: the running launch's tree is killed
    try:
        for rnd in range(args.repeats):
            for grp in groups:
                worlds_now = [[w] for w in worlds] if args.pairwise else [worlds]
                for ws in worlds_now:
                    # A B in even rounds, B A in odd ones (ABBA): a drift of the machine over the call
                    # lands on both sides alike instead of always favouring the side that runs second.
                    sides = ("harness", "plain") if rnd % 2 == 0 or args.fixed_order else ("plain", "harness")
                    for side in sides:
                        if side == "harness":
                            stop = not timed("harness", lambda: run_harness(grp, ws, rnd, args, state))
                        else:
                            stop = not all(timed("plain", lambda w=w: run_plain(grp, w, rnd, args, state)) for w in ws)
                        if stop:
                            break
                    if stop:
                        break
                if stop:
                    break
            if stop:
                break
    except KeyboardInterrupt as e:  # what finished is saved, and named
        save(state, path)
        e.run_dir = path  # type: ignore[attr-defined]
        return report_interrupt(e, "the finished runs")
    finally:
        restore_stop_handlers()
    rows = table(state, families, worlds)
    save(state, path, rows)
    gpus = sorted({r["row"].get("gpu") for r in state.runs if r["side"] == "plain" and r["ok"]} - {None})
    print(f"\nharness / plain step time, {harness_workload(args)}, global batch {args.global_batch or 'default'}, "
          f"{args.steps} steps after {args.warmup} warm-up, medians over rounds; ratio = median of per-round "
          f"ratios [min, max]; floor = plain max/min - 1 over rounds; h>p = rounds harness slower; "
          f"device: {', '.join(gpus) or '?'}")
    print_table(rows)
    print(f"\nraw results: {path}", flush=True)
    return 0 if all(r["n"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
