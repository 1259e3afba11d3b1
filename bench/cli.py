"""The `parbench` command: run | report | compare | history | export | comm | list."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from bench import UserError, __version__


def _add_run(sub) -> None:
    p = sub.add_parser("run", help="run a benchmark matrix and write results/<run-id>/")
    p.add_argument("--config", help="TOML file with any of the settings below (flags win)")
    p.add_argument("--workloads", help="comma list: mlp, convnet, gpt-tiny..gpt-200m, name[dim=N,...], "
                                       "or package.module:factory")
    p.add_argument("--strategies", help="comma list of strategies, or 'all' (default)")
    p.add_argument("--backends", help="comma list: nccl, gloo")
    p.add_argument("--world-sizes", help="comma list of world sizes, e.g. 1,2,4")
    p.add_argument("--device", help="cpu or cuda (default: cuda when GPUs are visible)")
    p.add_argument("--steps", type=int, help="timed steps per cell")
    p.add_argument("--warmup", type=int, help="untimed warm-up steps per cell")
    p.add_argument("--seed", type=int)
    p.add_argument("--precision", help="auto (bf16 on cuda, fp32 on cpu), fp32 or bf16")
    p.add_argument("--global-batch", type=int, help="override every workload's global batch")
    p.add_argument("--scaling", help="strong (default: the same global batch at every world size) or weak "
                                     "(the same batch per device: n devices train n x the global batch)")
    p.add_argument("--cell-timeout", dest="cell_timeout_s", type=float, help="seconds before a cell is a timeout")
    p.add_argument("--sample-hz", type=float, help="telemetry sampling rate, 0 = off (default 20, max 1000)")
    p.add_argument("--profile-steps", type=int,
                   help="steps profiled after the timed ones for the compute/comm breakdown (default 2; 0 = off)")
    p.add_argument("--trace", action="store_true", default=None,
                   help="keep each rank's Chrome trace (opens in Perfetto) under RUN/traces/")
    p.add_argument("--repeats", type=int, help="measure each cell N times, in shuffled rounds (default 1)")
    p.add_argument("--budget", help="time budget for the whole run, e.g. 10m: repeats, steps and caps are "
                                    "planned to fit (GPU default 10m; 'off' for none)")
    p.add_argument("--warmup-max", type=int, help="warm-up continues until the step time settles, up to this "
                                                   "(default 4 x --warmup)")
    p.add_argument("--steps-max", type=int, help="timed steps continue until --target-ci, up to this "
                                                  "(default 3 x --steps)")
    p.add_argument("--target-ci", type=float, help="relative half-width of the median's 95%% interval to reach "
                                                   "(default 0.02; 0 = fixed step count)")
    p.add_argument("--time-cap", dest="time_cap_s", type=float,
                   help="seconds of timed steps after which no more are added (default 20)")
    p.add_argument("--option", action="append", metavar="KEY=VALUE", default=[],
                   help="strategy option, repeatable: mesh=2x2, micro_batches=8, bucket_mb=25")
    p.add_argument("--out", help="results folder (default: results)")
    p.add_argument("--report", action="store_true", help="also write the HTML report into the run folder")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def parse_options(items: list[str]) -> dict[str, object]:
    """['mesh=2x2', 'micro_batches=8'] -> {'mesh': '2x2', 'micro_batches': 8}."""
    out: dict[str, object] = {}
    for item in items:
        key, eq, val = item.partition("=")
        if not eq or not key.strip():
            raise UserError(f"option {item!r} must be KEY=VALUE, e.g. --option micro_batches=8")
        val = val.strip()
        try:
            out[key.strip()] = int(val)
        except ValueError:
            try:
                out[key.strip()] = float(val)
            except ValueError:
                out[key.strip()] = val
    return out


def cmd_run(args) -> int:
    from bench import launch
    from bench.config import build_config, load_toml
    from bench.hardware import gpu_count

    gpus = gpu_count()
    flags = {k: getattr(args, k) for k in ("workloads", "strategies", "backends", "world_sizes", "device",
                                           "steps", "warmup", "seed", "precision", "global_batch",
                                           "cell_timeout_s", "out", "sample_hz", "scaling", "repeats", "budget",
                                           "warmup_max", "steps_max", "target_ci", "time_cap_s",
                                           "profile_steps", "trace")}
    toml = load_toml(args.config) if args.config else {}
    if args.option:
        flags["options"] = {**toml.get("options", {}), **parse_options(args.option)}
    cfg = build_config(toml=toml, flags=flags, gpus=gpus)
    from bench.progress import MatrixProgress

    try:
        with MatrixProgress(enabled=not args.no_progress) as bar:
            run_dir = launch.run(cfg, gpus, on_progress=bar)
    except KeyboardInterrupt:
        print("interrupted: the cells that finished are in the run folder", file=sys.stderr)
        return 130
    from bench.summary import print_summary

    print_summary(run_dir)
    if args.report:
        from reports import build_report

        print(f"report: {build_report(run_dir)}")
    return 0


def cmd_report(args) -> int:
    from reports import build_report

    out = build_report(Path(args.run_dir), Path(args.output) if args.output else None)
    print(out)
    return 0


def cmd_list(args) -> int:
    import strategies
    from bench import workloads

    print("workloads:")
    for n in workloads.names():
        print(f"  {n:<20} {workloads.resolve(n).description}")
    print("  package.module:factory  your own: a factory returning bench.workloads.Workload")
    print("strategies:")
    for n, cls in strategies.REGISTRY.items():
        print(f"  {n:<20} {cls.summary}\n  {'':<20} needs: {cls.needs}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="parbench", description=__doc__)
    parser.add_argument("--version", action="version", version=f"parbench {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="cmd", required=True)
    _add_run(sub)
    p = sub.add_parser("report", help="HTML + PNG report of a run folder")
    p.add_argument("run_dir")
    p.add_argument("-o", "--output", help="output folder (default: RUN_DIR/report)")
    sub.add_parser("list", help="workloads and strategies, with what each needs")
    from bench import cli_comm, cli_regress

    cli_comm.register(sub)
    cli_regress.register(sub)  # compare, history, export
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(message)s")
    handlers = {"run": cmd_run, "report": cmd_report, "list": cmd_list, "comm": cli_comm.cmd_comm}
    try:
        if args.cmd in handlers:
            return handlers[args.cmd](args)
        return args.func(args)
    except UserError as e:
        print(f"parbench: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
