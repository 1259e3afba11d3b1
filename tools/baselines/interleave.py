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
would not finish in time; what finished is still tabled. The families are ``pairs.PAIRS``: edit it
when harness options change; an option the checkout's strategy does not declare, or a run flag its
``parbench run`` does not have, is dropped with a warning (the harness refuses unknown ones), and the
table says so.

Training knobs (``--optimizer``, ``--compile``, ``--ac``; ``knobs.py``): each pair states them once,
and both sides get them in their own spelling (``pairs.pair``). The harness cells of one call share
their run flags (they apply to every cell of a ``parbench run``). Both sides record the knobs they
trained with (the harness row's ``optimizer``, ``compile``, ``ac``, the plain line's); a round whose
sides differ (e.g. a run flag this checkout's harness lacks, dropped) is not compared, as for the
global batch below. Under compilation both sides leave
``knobs.warmup_steps(--warmup)`` steps untimed (the plain program extends its warm-up itself; the
harness gets that ``--warmup`` and ``--warmup-max``). The one-device families (``single-*``: the
harness's ``single`` against ``plain_ddp --no-ddp``) run at world size 1 only: give ``--world-sizes``
a 1 (``--world-sizes 1`` alone, or ``1,2`` beside the multi-GPU families, which run at every size
asked).

``--global-batch N`` and ``--dims K=V[,K=V]`` go to both sides alike: the harness gets
``--global-batch N`` and the workload as ``NAME[K=V,...]`` (its own syntax for dimensions), the
plain programs ``--global-batch N --dims K=V,...`` (``_common.setup`` resolves the workload with
them), so both build the same model on the same batches. Both sides record the global batch they
trained (the harness row's ``global_batch``, the plain line's); a round whose two sides report
different global batches is not compared (the table notes it). A record without the field (older
results) is taken as matching. E.g. ``--global-batch 64`` on 2 GPUs makes gpt-200m's steps
GPU-bound where the default 16 leaves them CPU-launch-bound, with a round-to-round noise of tens of
percent on the lent hosts.

The table and its noise verdict: ``ratios.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run as a script: make `bench` and `strategies` importable
    sys.path.insert(0, str(ROOT))

from bench.cli.common import report_interrupt  # noqa: E402
from bench.core import backends  # noqa: E402
from bench.runtime.process import child_env, free_port, run_ranks, run_tree, torchrun_cmd  # noqa: E402
from bench.runtime.signals import install_stop_handlers, restore_stop_handlers  # noqa: E402
from tools.baselines.pairs import (  # noqa: E402 - the table of pairs, re-exported: PAIRS, Pair
    DEFAULT_FAMILIES,
    PAIRS,
    Pair,
    family_worlds,
    group_worlds,
    harness_warmup,
    run_flag_items,
)
from tools.baselines.ratios import State, global_batch_of, print_table, table, verdict  # noqa: E402, F401

# Environment for both sides, as tools/device/device_run.sh (NVLink multicast off on lent machines).
GPU_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1",
           "PYTHONUNBUFFERED": "1"}


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
    note_dropped(state, family, dropped, f"harness strategy {pair.strategy!r} refuses")
    return tuple(keep)


def note_dropped(state: State, family: str, dropped: list[str], why: str) -> None:
    """Record what the harness side of ``family`` goes without, warning once per item."""
    new = [d for d in dropped if d not in state.dropped.get(family, [])]
    if new:
        state.dropped.setdefault(family, []).extend(new)
        print(f"WARNING {family}: {why} {new}; dropped (edit PAIRS in tools/baselines/pairs.py)", flush=True)


def effective_run_flags(family: str, pair: Pair, state: State, args: argparse.Namespace) -> tuple[str, ...]:
    """The pair's ``parbench run`` flags less those this checkout's CLI does not have (recorded as
    dropped, with a warning: the harness would refuse the whole call)."""
    text = cli_help(args)
    keep: list[str] = []
    dropped: list[str] = []
    for flag, value in run_flag_items(pair.run_flags):
        if re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", text):  # the flag, not a longer one
            keep += [flag, value]
        else:
            dropped.append(f"{flag} {value} (no such parbench run flag)")
    note_dropped(state, family, dropped, "this checkout's `parbench run` lacks")
    return tuple(keep)


def harness_groups(families: list[str], state: State, args: argparse.Namespace) -> list[list[str]]:
    """Families whose harness cells can share one ``parbench run``. ``--option`` and the run flags
    (the training knobs) apply to every cell of a run, so members need distinct strategies and the
    same run flags, and every option a member's strategy declares must have the value that member
    asked for (or be unset by all, for its default)."""
    opts = {f: dict(o.split("=", 1) for o in effective_options(f, PAIRS[f], state)) for f in families}
    keys = {f: set(declared_options(PAIRS[f].strategy) or opts[f]) for f in families}
    runf = {f: sorted(run_flag_items(effective_run_flags(f, PAIRS[f], state, args))) for f in families}

    def compatible(members: list[str], fam: str) -> bool:
        group = [*members, fam]
        if len({PAIRS[m].strategy for m in group}) < len(group) or any(runf[m] != runf[fam] for m in members):
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


def harness_cmd(fams: list[str], worlds: list[int], out: Path, args: argparse.Namespace,
                state: State) -> list[str]:
    """The ``parbench run`` of these families at these world sizes: their strategies, options and
    run flags (the members of a group share the run flags, :func:`harness_groups`), held to the
    plain side's warm-up (extended as the plain programs extend theirs under compilation)."""
    opts = sorted({o for f in fams for o in effective_options(f, PAIRS[f], state)})
    runf = list(dict.fromkeys(run_flag_items([a for f in fams for a in effective_run_flags(f, PAIRS[f], state, args)])))
    warmup = harness_warmup(fams, args.warmup)
    return [sys.executable, "-m", "bench", "run", "--no-progress", "--device", args.device,
            "--backends", args.backend, "--workloads", harness_workload(args),
            "--strategies", ",".join(dict.fromkeys(PAIRS[f].strategy for f in fams)),
            "--world-sizes", ",".join(map(str, worlds)), "--steps", str(args.steps), "--warmup", str(warmup),
            "--profile-steps", str(args.harness_profile_steps), "--sample-hz", "0",
            *(["--profile-at", args.harness_profile_at] if args.harness_profile_at else []),
            "--cell-timeout", str(args.run_timeout_s),
            "--out", str(out), *[a for o in opts for a in ("--option", o)], *[a for kv in runf for a in kv],
            *pin_flags(args, warmup), *(["--global-batch", str(args.global_batch)] if args.global_batch else [])]


def run_harness(fams: list[str], worlds: list[int], rnd: int, args: argparse.Namespace, state: State) -> None:
    """One ``parbench run`` of these families at these world sizes; one record per (family, world)
    for the world sizes each family runs at."""
    import pandas as pd

    out = Path(args.runs_dir) / f"r{rnd}-{'+'.join(fams)}-x{'+'.join(map(str, worlds))}"
    cmd = harness_cmd(fams, worlds, out, args, state)
    t = time.monotonic()
    p = run_tree(cmd, cwd=ROOT, env=env_for(max(worlds), args, ranks=False),
                 timeout_s=args.run_timeout_s * (2 + len(fams) * len(worlds)))
    wall = time.monotonic() - t
    cells = None
    found = sorted(out.glob("*/cells.parquet"))
    if found:
        cells = pd.read_parquet(found[-1])
    for fam in fams:
        for w in family_worlds(fam, worlds):
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


def pin_flags(args: argparse.Namespace, warmup: int) -> list[str]:
    """Flags that hold the harness to exactly ``warmup`` warm-up steps and --steps, as the plain
    programs run (the harness otherwise extends both until the step time settles); none where the
    checkout's CLI has no such flags, or with --harness-adaptive."""
    if args.harness_adaptive:
        return []
    text = cli_help(args)
    flags = []
    if "--warmup-max" in text:
        flags += ["--warmup-max", str(warmup)]
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


def plain_flags(family: str, args: argparse.Namespace) -> list[str]:
    """The plain program's flags of ``family``: the call's device, workload and steps, then the
    pair's own (its configuration and training knobs). Under --compile the program extends the
    warm-up itself (``knobs.warmup_steps``), as :func:`harness_cmd` does the harness's."""
    return ["--device", args.device, "--backend", args.backend, *workload_flags(args),
            "--steps", str(args.steps), "--warmup", str(args.warmup), *PAIRS[family].flags]


def run_plain(fams: list[str], world: int, rnd: int, args: argparse.Namespace, state: State) -> None:
    """The plain programs of these families at one world size; one record each. With
    ``--separate-plain`` (or one family) each program is its own launch; otherwise one launch of
    ``plain_many`` runs them in turn (each its own process group and JSON line, the interpreter and
    CUDA context paid once)."""
    flags = {f: plain_flags(f, args) for f in fams}
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
    ~0.05-0.25 s (0.15 assumed); a compiled cell or program ~60 s more (assumed, not measured)."""
    step = 0.15 * (args.steps + args.warmup)
    fw = {f: family_worlds(f, worlds) for f in families}
    calls = ([(1, [w], PAIRS[f].compiled) for f in families for w in fw[f]] if args.pairwise
             else [(len(g), group_worlds(g, worlds), any(PAIRS[f].compiled for f in g)) for g in groups])
    harness = sum(20 * (1 + len(ws)) + (step + 3 + 60 * c) * (1 + n * len(ws)) for n, ws, c in calls)
    # one launch per program with --pairwise or --separate-plain, else one per group and world size
    launches = (sum(map(len, fw.values())) if (args.pairwise or args.separate_plain)
                else sum(len(group_worlds(g, worlds)) for g in groups))
    plain = launches * 8 + sum(len(fw[f]) * (4 + step + 60 * PAIRS[f].compiled) for f in families)
    return args.repeats * (harness + plain)


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, list[str], list[int]]:
    """The call's flags, its families and world sizes, checked before any run."""
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
    if min(worlds) < 1:
        raise SystemExit(f"--world-sizes {args.world_sizes}: world sizes are >= 1")
    idle = [f for f in families if not family_worlds(f, worlds)]
    if idle:
        raise SystemExit(f"{idle} run on one device: add 1 to --world-sizes (now {worlds})")
    args.dims_parsed = parse_dims(args.dims)
    check_batch(args, families, worlds)
    return args, families, worlds


def run_rounds(groups: list[list[str]], worlds: list[int], args: argparse.Namespace, state: State,
               path: Path) -> None:
    """Every round: per harness group, its harness call and its plain launches (per world size the
    group runs at), in ABBA order, until the rounds are done or the deadline stops them."""
    longest = {"harness": 0.0, "plain": 0.0}

    def timed(kind: str, run) -> bool:
        """Run one harness call or plain launch if it fits the deadline; False when it does not."""
        if state.elapsed() + longest[kind] * 1.1 >= args.deadline_s:
            log(state, f"deadline {args.deadline_s:.0f}s: not starting another {kind} run")
            return False
        t = time.monotonic()
        run()
        longest[kind] = max(longest[kind], time.monotonic() - t)
        save(state, path)
        return True

    for rnd in range(args.repeats):
        for grp in groups:
            gw = group_worlds(grp, worlds)
            for ws in ([[w] for w in gw] if args.pairwise else [gw]):
                # A B in even rounds, B A in odd ones (ABBA): a drift of the machine over the call
                # lands on both sides alike instead of always favouring the side that runs second.
                sides = ("harness", "plain") if rnd % 2 == 0 or args.fixed_order else ("plain", "harness")
                for side in sides:
                    if side == "harness":
                        ok = timed("harness", lambda: run_harness(grp, ws, rnd, args, state))
                    else:  # at each world size, the members that run there
                        ok = all(timed("plain", lambda w=w: run_plain([f for f in grp if w in family_worlds(f, worlds)],
                                                                      w, rnd, args, state)) for w in ws)
                    if not ok:
                        return


def main(argv: list[str] | None = None) -> int:
    args, families, worlds = parse_args(argv)
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
    groups = [[f] for f in families] if args.pairwise else harness_groups(families, state, args)
    n_p = args.repeats * sum(len(family_worlds(f, worlds)) for f in families)
    est = estimate_s(groups, families, worlds, args)
    log(state, f"{len(families)} families x world sizes {worlds} x {args.repeats} rounds: {n_p} plain runs; "
               f"harness groups {groups}; about {est / 60:.1f} min on GPU (estimate); results -> {path}")
    if est > args.deadline_s:
        log(state, f"WARNING: the estimate exceeds --deadline-s {args.deadline_s:.0f}: later rounds will be cut; "
                   "split the call (by --world-sizes or --families)")
    install_stop_handlers()  # SIGTERM and SIGHUP stop the call as Ctrl-C does: the running launch's tree is killed
    try:
        run_rounds(groups, worlds, args, state, path)
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
