"""Run configuration: this machine's defaults, then a TOML file, then flags, validated before
anything launches. The settings themselves are declared in :mod:`bench.core.settings`.

The default matrix adapts to the machine: with no GPU, Gloo on the CPU at world sizes 1 and 2 with
small workloads; with GPUs, NCCL and Gloo over every visible GPU.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from bench.core.errors import UserError
from bench.core.mesh import Mesh
from bench.core.rendezvous import validate_nodes
from bench.core.values import as_float, as_int, int_list, parse_duration, split_list

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from bench.core import backends as _backends
from bench.core import knobs
from bench.core.settings import BY_KEY, RunConfig, flatten_toml

BACKENDS = tuple(_backends.names())  # the backend registry is the one list
DEVICES = BY_KEY["device"].choices
PRECISIONS = BY_KEY["precision"].choices


#: What the default GPU matrix runs its model that no single GPU holds on: the strategies that cut a
#: model (DDP too, which the plan skips as out of memory, so that the report says why), on NCCL.
BEYOND_STRATEGIES = ("ddp", "fsdp", "tensor", "pipeline-1f1b")


def default_config(gpus: int, beyond: str | None = None) -> RunConfig:
    """The matrix `parbench run` with no arguments runs on a machine with ``gpus`` GPUs; ``beyond``
    is a workload that no single one of them holds (:func:`bench.plan.memory.beyond_one_device`),
    run on several GPUs only."""
    if gpus == 0:
        # The declared defaults are a CPU machine's, with a shorter cell timeout and a budget that ends
        # the run within 5 minutes on 2 cores (the last third on the decisions still open).
        return RunConfig.from_flat({"cell_timeout_s": 120.0, "budget": "4m"})
    # Every power of two from 2 up to the GPUs, and all of them; one GPU runs only the single-device
    # reference every workload gets (a strategy on one GPU decides nothing about parallelising: the
    # planner runs none at world size 1 unless named), and the search finds its knobs and batch within
    # a budget that, with an install, ends within 10 minutes.
    sizes = sorted({gpus} | {2**k for k in range(1, 4) if 2**k <= gpus}) if gpus > 1 else [1]
    # Real models under a 10-minute budget whose last third goes to the decisions still open.
    # gpt-200m fits one GPU: every strategy, NCCL, and DDP on Gloo (is NCCL worth it?), against the
    # one-GPU reference. Its global batch, 64 sequences of 1024 tokens (16 a GPU on 4), keeps the
    # steps bound by the GPUs rather than by launching kernels (at gpt-200m's own 16, 4 a GPU, steps
    # on 4 H100s were launch-bound, noisy, and stretched by any profiling). The second model is
    # sized so that its parameters, gradients and AdamW state alone exceed one GPU: the reason sharding,
    # pipelining and tensor parallelism exist; the recommendation names the fastest strategy that
    # fits, with its memory headroom; it runs on two GPUs or more, when their memory is known. The
    # toy models (mlp, convnet) measure kernel launches more than strategies; they are in
    # configs/launch-bound.toml.
    workloads, matrix = ["gpt-200m[global_batch=64]"], {}
    if beyond and gpus > 1:
        workloads.append(beyond)
        matrix = {beyond: {"strategies": list(BEYOND_STRATEGIES), "backends": ["nccl"], "world_sizes": [gpus]}}
    return RunConfig.from_flat(dict(workloads=workloads, strategies=["all"], backends=["nccl", "gloo"],
                                    world_sizes=sizes, device="cuda", steps=30, warmup=5,
                                    budget="10m" if gpus > 1 else "7m",
                                    backend_strategies={"gloo": ["ddp"]}, workload_matrix=matrix))


#: When the profiled steps run (profiling.profile_at)
PROFILE_AT = BY_KEY["profile_at"].choices

#: The settings that say how a cell is measured; given explicitly, a budget plan keeps them.
MEASURE_KEYS = ("steps", "warmup", "repeats", "warmup_max", "steps_max", "target_ci", "time_cap_s", "profile_steps")


_DIMS = re.compile(r"^(?P<name>[^\[\]]+)\[(?P<dims>[^\]]*)\]$")


def parse_workload(spec: str) -> tuple[str, dict[str, int]]:
    """``gpt-small[d_model=512,n_layer=8]`` -> ("gpt-small", {"d_model": 512, "n_layer": 8})."""
    m = _DIMS.match(spec)
    if not m:
        if "[" in spec or "]" in spec:
            raise UserError(f"workload {spec!r}: write dimensions as name[key=value,...]")
        return spec, {}
    dims: dict[str, int] = {}
    for item in split_list(m["dims"]):
        key, eq, val = item.partition("=")
        if eq and re.fullmatch(r"\s*-\d+\s*", val):
            raise UserError(f"workload {spec!r}: {key.strip()}={val.strip()} must be >= 1 (a size or a count); "
                            "drop it for the workload's default")
        if not eq or not val.strip().isdigit():
            raise UserError(f"workload {spec!r}: dimension {item!r} must be key=<integer>")
        if int(val) > DIM_MAX:
            raise UserError(f"workload {spec!r}: {key.strip()}={val.strip()} is more than {DIM_MAX:,} (a typo?); "
                            "give a size a model can have")
        dims[key.strip()] = int(val)
    return m["name"].strip(), dims


def load_toml(path: str) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        what = "is a folder" if p.is_dir() else "is not a regular file (a pipe or a device)" if p.exists() \
            else "not found"
        raise UserError(f"config {path!r} {what}; pass a TOML file (see configs/)")
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise UserError(f"config {path!r} is not valid TOML: {e}") from None
    except UnicodeDecodeError as e:
        raise UserError(f"config {path!r} is not UTF-8 text (byte {e.start}); save it as UTF-8") from None
    except RecursionError:
        raise UserError(f"config {path!r} nests its tables or arrays too deep; a run's settings are at most a "
                        "few levels deep") from None
    except OSError as e:
        raise UserError(f"config {path!r} cannot be read ({e.strerror}); pass a readable TOML file") from None
    return data


def build_config(*, toml: dict[str, Any] | None, flags: dict[str, Any], gpus: int,
                 beyond: str | None = None) -> RunConfig:
    """Defaults for this machine (``beyond``: see :func:`default_config`), then the TOML file, then
    the flags; validated."""
    base = default_config(gpus, beyond).flat()
    known = set(BY_KEY)  # "pinned" too, recomputed below (a meta.json's config may be given back)
    merged: dict[str, Any] = dict(base)
    toml = flatten_toml(toml or {})
    for source, values in (("config file", toml), ("flags", flags)):
        for key, val in values.items():
            key = key.replace("-", "_")
            if key not in known:
                raise UserError(f"{source}: unknown setting {key!r}; known: "
                                f"{', '.join(sorted(k for k in known if k != 'pinned'))}")
            if val is not None:
                merged[key] = val
    # A device given without its own backends/world sizes gets that device's defaults.
    given = {k.replace("-", "_") for src in (toml or {}, flags) for k, v in src.items() if v is not None}
    if "device" in given and merged["device"] != base["device"]:
        dev_default = default_config(0 if merged["device"] == "cpu" else max(gpus, 1)).flat()
        for key in ("backends", "world_sizes", "workloads", "global_batch", "steps", "warmup", "cell_timeout_s",
                    "budget", "workload_matrix"):
            if key not in given:
                merged[key] = dev_default[key]
    if ({"strategies", "backends"} & given) and "backend_strategies" not in given:
        merged["backend_strategies"] = {}  # the user's own matrix: every strategy on every backend
    merged["pinned"] = [k for k in MEASURE_KEYS if k in given]
    if merged["pinned"] and "budget" not in given:
        merged["budget"] = None  # the user chose how to measure: no default budget rewrites it
    for key in ("workloads", "strategies", "backends"):
        if isinstance(merged[key], str):
            merged[key] = split_list(merged[key])
    _keep_or_drop_sized(merged, base, given)
    merged["world_sizes"] = int_list(merged["world_sizes"], "world sizes")
    if "world_sizes" not in given and several_nodes(merged):
        # The machine's defaults are per node: n nodes run n times each (and the one-device reference).
        merged["world_sizes"] = sorted({1} | {w * merged["nnodes"] for w in merged["world_sizes"]})
    return validate(merged)


#: Settings that make the matrix the user's own: the default's model sized beyond one GPU then stays out.
MATRIX_KEYS = frozenset({"workloads", "strategies", "backends", "world_sizes", "global_batch", "scaling"})


def several_nodes(merged: dict[str, Any]) -> bool:
    """Whether the merged settings (not yet validated) ask for a run over two nodes or more."""
    n = merged["nnodes"]
    return isinstance(n, int) and not isinstance(n, bool) and n > 1


def _adamw_only(merged: dict[str, Any]) -> bool:
    """Whether the merged settings train with AdamW alone, the optimizer the default model beyond one
    GPU is sized for (bench.plan.memory.beyond_one_device): under SGD alone it would fit one GPU."""
    given = merged["training"].get("optimizer") if isinstance(merged["training"], dict) else None
    if given is None:
        return True
    return (given.split(",") if isinstance(given, str) else given) in (["adamw"], "adamw")


def _keep_or_drop_sized(merged: dict[str, Any], base: dict[str, Any], given: set[str]) -> None:
    """The default GPU matrix's model sized beyond one GPU (its [workload_matrix] entry) runs only in
    that matrix: a run that chooses its own workloads, strategies, backends, world sizes, batch or
    scaling, or spans several nodes (whose memories the plan does not read), leaves it out. A user's
    own [workload_matrix] entries join the default's."""
    listed = merged["workloads"] if isinstance(merged["workloads"], list) else []
    sized = [w for w in base["workload_matrix"] if w in listed]
    mine = merged["workload_matrix"] if "workload_matrix" in given else {}
    if (MATRIX_KEYS & given) or several_nodes(merged) or not _adamw_only(merged):
        if "workloads" not in given:
            merged["workloads"] = [w for w in listed if w not in base["workload_matrix"]]
        merged["workload_matrix"] = mine
    elif base["workload_matrix"] and isinstance(mine, dict):  # else validate() says what it must be
        merged["workload_matrix"] = {**{w: base["workload_matrix"][w] for w in sized}, **mine}


SEED_MAX = 2**40  # seed * 1_000_003 + step (bench.workloads.base.seeded) stays within 63 bits
LR_MAX = 100.0  # past this every step diverges: a typo, not a learning rate
DIM_MAX = 2**31 - 1  # a workload dimension: beyond any real model's, and the tables' counts stay in range
COUNT_MAX = 1_000_000  # the most steps, warm-up steps, repeats or profiled steps a run may ask for


def validate(flat: dict[str, Any]) -> RunConfig:
    """Every setting of ``flat`` (flat keys, as merged or as a meta.json holds them) checked by type
    and range, before anything launches; the run's configuration. TypeError names an unknown key."""
    unknown = [k for k in flat if k not in BY_KEY]
    if unknown:
        raise TypeError(f"unknown setting {unknown[0]!r}")
    cfg = SimpleNamespace(**{**RunConfig().flat(), **flat})
    _check_choices(cfg)
    counts = _counts(cfg)
    _check_profiling(cfg, counts["profile_steps"])
    _check_caps(cfg, counts)
    if isinstance(cfg.budget, str) and not cfg.budget.strip():
        raise UserError("--budget '' is empty: give a duration (e.g. --budget 10m) or --budget off")
    budget = None if cfg.budget in (None, "off", "none") else parse_duration(cfg.budget)
    global_batch = None if cfg.global_batch is None else as_int("global_batch", cfg.global_batch,
                                                                  "--global-batch 16")
    if global_batch is not None and global_batch < 1:
        raise UserError(f"global batch {cfg.global_batch} must be >= 1")
    if not isinstance(cfg.options, dict):
        raise UserError("options must be a TOML table, e.g. [options] bucket_mb = 25")
    _check_backend_strategies(cfg)
    workload_matrix = _check_workload_matrix(cfg)
    nnodes, node_rank, endpoint, rdzv_timeout_s = validate_nodes(cfg)
    _check_mesh(cfg)
    return RunConfig.from_flat({**vars(cfg), **counts, "global_batch": global_batch, "workload_matrix": workload_matrix,
                                "training": knobs.validate(cfg.training),
                                "budget": None if budget is None else f"{budget:.15g}s", "nnodes": nnodes,
                                "node_rank": node_rank, "rdzv_endpoint": endpoint, "rdzv_timeout_s": rdzv_timeout_s})


def _check_backend_strategies(cfg: SimpleNamespace) -> None:
    """[backend_strategies]: known backends of the run, each with a list of strategy names."""
    bs = cfg.backend_strategies
    if not isinstance(bs, dict):
        raise UserError('backend_strategies must be a TOML table, e.g. [backend_strategies] gloo = ["ddp"]')
    for be, names in bs.items():
        if be not in BACKENDS:
            raise UserError(f"backend_strategies: unknown backend {be!r}; use one of {', '.join(BACKENDS)}")
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise UserError(f"backend_strategies.{be} must be a list of strategy names, e.g. [\"ddp\", \"fsdp\"]")


#: what a [workload_matrix] entry may narrow
WORKLOAD_MATRIX_KEYS = ("strategies", "backends", "world_sizes")


def _check_workload_matrix(cfg: SimpleNamespace) -> dict[str, dict[str, list]]:
    """[workload_matrix]: workloads of the run, each narrowed to a non-empty part of the run's
    backends and world sizes (strategies: see bench.plan.matrix.check_strategy_names); returned
    with its world sizes as integers."""
    wm = cfg.workload_matrix
    if not isinstance(wm, dict):
        raise UserError('workload_matrix must be a TOML table, e.g. [workload_matrix."gpt-20b"] strategies = ["fsdp"]')
    out: dict[str, dict[str, list]] = {}
    for wl, limits in wm.items():
        where = f'[workload_matrix."{wl}"]'
        if wl not in cfg.workloads:
            raise UserError(f"{where}: {wl!r} is not a workload of the run; name one of "
                            f"{', '.join(map(repr, cfg.workloads))} as written there, or drop the entry")
        if not isinstance(limits, dict):
            raise UserError(f'{where} must be a table, e.g. strategies = ["fsdp"]')
        out[wl] = {}
        for key, vals in limits.items():
            if key not in WORKLOAD_MATRIX_KEYS:
                raise UserError(f"{where}: unknown key {key!r}; use {', '.join(WORKLOAD_MATRIX_KEYS)}")
            if key == "world_sizes":
                vals = int_list(vals, f"{where} world_sizes", example=f"world_sizes = {cfg.world_sizes}")
            elif not isinstance(vals, list) or not all(isinstance(v, str) for v in vals):
                raise UserError(f'{where} {key} must be a list of names, e.g. {key} = ["{_example(key)}"]')
            if not vals:
                raise UserError(f"{where} {key} is empty: name at least one, or drop the key for all of the run's")
            run = cfg.world_sizes if key == "world_sizes" else cfg.backends if key == "backends" else None
            outside = [v for v in vals if run is not None and v not in run]
            if outside:
                raise UserError(f"{where} {key}: {outside[0]!r} is not among the run's {key} ({run}); add it to "
                                f"the run's or drop it here")
            out[wl][key] = list(vals)
    return out


def _example(key: str) -> str:
    return "nccl" if key == "backends" else "fsdp"


def _check_choices(cfg: SimpleNamespace) -> None:
    """The name lists (workloads, strategies, backends) and the settings chosen from a fixed set."""
    for key in ("workloads", "strategies", "backends"):
        vals = getattr(cfg, key)
        if not isinstance(vals, list) or not all(isinstance(v, str) for v in vals):
            raise UserError(f"{key} must be a list of names (or a comma list); got {vals!r}")
    if not cfg.workloads:
        raise UserError("no workloads given; e.g. --workloads mlp,gpt-tiny")
    for w in cfg.workloads:
        parse_workload(w)
    if not cfg.strategies:
        raise UserError("no strategies given; e.g. --strategies all")
    bad = [b for b in cfg.backends if b not in BACKENDS]
    if bad or not cfg.backends:
        raise UserError(f"backend {bad[0] if bad else '(none)'!r} unknown; use {' and/or '.join(BACKENDS)}")
    if cfg.device not in DEVICES:
        raise UserError(f"device {cfg.device!r} unknown; use cpu or cuda")
    if cfg.scaling not in ("strong", "weak"):
        raise UserError(f"scaling {cfg.scaling!r} unknown; use strong (fixed global batch) or weak (fixed per-device "
                        "batch)")
    if cfg.precision not in PRECISIONS:
        raise UserError(f"precision {cfg.precision!r} unknown; use auto, fp32 or bf16")
    if cfg.precision == "bf16" and cfg.device == "cpu":
        raise UserError("precision 'bf16' is for CUDA here; use --precision fp32 on cpu")
    if not isinstance(cfg.out, str) or not cfg.out.strip():
        raise UserError(f"out {cfg.out!r} is empty: give the folder for the run's results, e.g. --out results")
    if cfg.profile_at not in PROFILE_AT:
        raise UserError(f"profile_at {cfg.profile_at!r} unknown; use {', '.join(PROFILE_AT)} (e.g. --profile-at auto)")
    if cfg.memory_probe not in BY_KEY["memory_probe"].choices:
        raise UserError(f"memory_probe {cfg.memory_probe!r} unknown; use auto, on or off (e.g. --memory-probe on)")
    if not isinstance(cfg.trace, bool):
        raise UserError(f"trace={cfg.trace!r} must be true or false")
    if not isinstance(cfg.adaptive, bool):
        raise UserError(f"adaptive={cfg.adaptive!r} must be true or false")


def _counts(cfg: SimpleNamespace) -> dict[str, Any]:
    """The numeric settings as numbers, each in its range; the caps' defaults (3 x steps, 4 x
    warmup) filled in."""
    steps = as_int("steps", cfg.steps, "--steps 20")
    warmup = as_int("warmup", cfg.warmup, "--warmup 3")
    seed = as_int("seed", cfg.seed, "--seed 0")
    profile_steps = as_int("profile_steps", cfg.profile_steps, "--profile-steps 2")
    cell_timeout_s = as_float("cell_timeout_s", cfg.cell_timeout_s, "--cell-timeout 300")
    startup_timeout_s = as_float("startup_timeout_s", cfg.startup_timeout_s, "--startup-timeout 300")
    workload_timeout_s = as_float("workload_timeout_s", cfg.workload_timeout_s, "--workload-timeout 120")
    sample_hz = as_float("sample_hz", cfg.sample_hz, "--sample-hz 20")
    lr = None if cfg.lr is None else as_float("lr", cfg.lr, "--lr 3e-4")
    parity = None if cfg.parity_tol is None else as_float("parity_tol", cfg.parity_tol, "--parity-tol 1e-4")
    if parity is not None and not 0 < parity < 1:
        raise UserError(f"--parity-tol {cfg.parity_tol}: a relative tolerance is > 0 and < 1; "
                        "e.g. --parity-tol 1e-4")
    if lr is not None and not 0 < lr <= LR_MAX:
        raise UserError(f"lr={cfg.lr} must be > 0 and at most {LR_MAX:g}; e.g. --lr 3e-4, or drop it for the "
                        "optimizer's default")
    if steps < 1:
        raise UserError(f"steps={steps} must be >= 1; e.g. --steps 20")
    if warmup < 0:
        raise UserError(f"warmup={warmup} must be >= 0; e.g. --warmup 3")
    if cell_timeout_s <= 0:
        raise UserError(f"--cell-timeout {cfg.cell_timeout_s:g}: use seconds > 0, e.g. --cell-timeout 300")
    if startup_timeout_s <= 0:
        raise UserError(f"--startup-timeout {startup_timeout_s:g}: use seconds > 0, e.g. --startup-timeout 300")
    if workload_timeout_s <= 0:
        raise UserError(f"--workload-timeout {workload_timeout_s:g}: use seconds > 0, e.g. --workload-timeout 120")
    if not (sample_hz == 0 or 0.01 <= sample_hz <= 1000):
        raise UserError(f"sample rate {cfg.sample_hz} Hz must be 0 (off) or from 0.01 to 1000; e.g. --sample-hz 20")
    if profile_steps < 0:
        raise UserError(f"profile_steps={cfg.profile_steps} must be >= 0 (0: no breakdown)")
    repeats = as_int("repeats", cfg.repeats, "--repeats 3")
    if repeats < 1:
        raise UserError(f"repeats={repeats} must be >= 1; e.g. --repeats 3")
    if not 0 <= seed <= SEED_MAX:
        raise UserError(f"seed={seed} must be from 0 to 2**40 (each step's data seed is derived from it and must fit "
                        "64 bits); e.g. --seed 0")
    return dict(steps=steps, warmup=warmup, seed=seed, lr=lr, parity_tol=parity, sample_hz=sample_hz,
                profile_steps=profile_steps,
                cell_timeout_s=cell_timeout_s, startup_timeout_s=startup_timeout_s,
                workload_timeout_s=workload_timeout_s, repeats=repeats,
                warmup_max=warmup * 4 if cfg.warmup_max is None else as_int("warmup_max", cfg.warmup_max,
                                                                             "--warmup-max 20"),
                steps_max=steps * 3 if cfg.steps_max is None else as_int("steps_max", cfg.steps_max,
                                                                          "--steps-max 100"),
                settle=as_float("settle", cfg.settle, "settle = 0.01"),
                target_ci=as_float("target_ci", cfg.target_ci, "--target-ci 0.02"),
                time_cap_s=as_float("time_cap_s", cfg.time_cap_s, "--time-cap 20"))


def _check_profiling(cfg: SimpleNamespace, profile_steps: int) -> None:
    """A trace or a profile placement needs profiled steps."""
    if cfg.trace and profile_steps == 0:
        raise UserError("--trace needs profiled steps; drop --profile-steps 0")
    if cfg.profile_at != "auto" and profile_steps == 0:
        raise UserError(f"--profile-at {cfg.profile_at} needs profiled steps; drop --profile-steps 0 or --profile-at")


def _check_caps(cfg: SimpleNamespace, c: dict[str, Any]) -> None:
    """The adaptive loops' caps against the counts they cap, and every count below COUNT_MAX."""
    steps, warmup, steps_max, warmup_max = c["steps"], c["warmup"], c["steps_max"], c["warmup_max"]
    for flag, val, count in (("--steps-max", steps_max, "--steps"), ("--warmup-max", warmup_max, "--warmup")):
        if val < 0:
            raise UserError(f"{flag} {val} must be >= 0 (0: exactly {count})")
    # the loops only ever add steps, so a cap below the count it caps would be a fixed count in disguise
    if 0 < steps_max < steps:
        raise UserError(f"steps_max={steps_max} is below steps={steps}: the cap must be >= the timed steps; "
                        f"e.g. --steps-max {3 * steps}, or --steps-max 0 for exactly --steps {steps}")
    if 0 < warmup_max < warmup:
        raise UserError(f"warmup_max={warmup_max} is below warmup={warmup}: the cap must be >= the warm-up steps; "
                        f"e.g. --warmup-max {4 * warmup}, or --warmup-max 0 for exactly --warmup {warmup}")
    # counts past any real measurement (a million steps of a 1 ms cell is 17 minutes) are typos, and
    # --steps 1e20 would overflow the tables' int64 columns after the cells ran
    for key, example in (("steps", "--steps 20"), ("warmup", "--warmup 3"), ("repeats", "--repeats 3"),
                         ("warmup_max", "--warmup-max 20"), ("steps_max", "--steps-max 100"),
                         ("profile_steps", "--profile-steps 2")):
        given = getattr(cfg, key) is not None  # the caps' defaults (3 x steps, 4 x warmup) follow the counts
        if given and c[key] > COUNT_MAX:
            raise UserError(f"{key}={c[key]} is more than {COUNT_MAX:,} (a typo?); e.g. {example}")
    if c["time_cap_s"] < 0:
        raise UserError(f"--time-cap {c['time_cap_s']:g} must be >= 0 seconds (0: no cap); e.g. --time-cap 20")
    if not 0 <= c["settle"] < 1 or not 0 <= c["target_ci"] < 1:
        raise UserError(f"settle={c['settle']} and target_ci={c['target_ci']} must be fractions in [0, 1) (0: off)")


def _check_mesh(cfg: SimpleNamespace) -> None:
    """An explicit mesh's rank count is one of the world sizes."""
    if "mesh" not in cfg.options:
        return
    try:
        size = Mesh.grid(cfg.options["mesh"], 0, "mp").size
    except ValueError as e:
        raise UserError(str(e)) from None
    if size not in cfg.world_sizes:
        raise UserError(f"mesh {cfg.options['mesh']} has {size} ranks but world sizes are "
                        f"{cfg.world_sizes}; add {size} to --world-sizes or change the mesh")


