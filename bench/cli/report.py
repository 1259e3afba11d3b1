"""``parbench report``: the HTML and PNG report of a run folder."""

from __future__ import annotations

from pathlib import Path

from bench.cli.gate import stoppable
from bench.core.errors import UserError


def register(sub) -> None:
    p = sub.add_parser("report", help="HTML + PNG report of a run folder")
    p.add_argument("run_dir")
    p.add_argument("-o", "--output", help="output folder (default: RUN_DIR/report)")
    p.add_argument("--baseline", help="add the statistical comparison with this run (regressions first)")
    p.add_argument("--history", help="add the comparison with this history store's last stable values")
    p.add_argument("--threshold", help="with --baseline or --history: step-time slowdown that fails (default 5%%, "
                                       "as parbench compare)")
    p.set_defaults(func=cmd_report)


def cmd_report(args) -> int:
    from reports import build_report

    if args.output and Path(args.output).exists() and not Path(args.output).is_dir():
        raise UserError(f"-o {args.output!r} is an existing file; the report is a folder: pass a new or existing "
                        "folder name")
    if args.output:
        from bench.results.lock import check_outputs

        check_outputs(o=args.output)
    if args.baseline and args.history:
        raise UserError("give --baseline RUN or --history DIR, not both")
    if args.threshold is not None and not (args.baseline or args.history):
        raise UserError(f"--threshold {args.threshold} judges a comparison; add --baseline RUN or --history DIR")
    threshold = None
    if args.threshold is not None:
        from bench.gate.compare import parse_threshold

        threshold = parse_threshold(args.threshold)
    for flag, path in (("--baseline", args.baseline), ("--history", args.history)):
        if path and not Path(path).is_dir():
            raise UserError(f"{flag} {path!r} is not a folder; pass a run folder (--baseline) or a history store "
                            "(--history)")
    out = Path(args.output) if args.output else Path(args.run_dir) / "report"
    done: list[Path] = []

    def work() -> int:
        done.append(build_report(Path(args.run_dir), out, baseline=Path(args.baseline) if args.baseline else None,
                                 history=Path(args.history) if args.history else None, threshold=threshold))
        print(done[0])
        return 0

    return stoppable(work, lambda: f"the report was written to {done[0]} before it stopped" if done else
                     f"no report was written; {out / 'index.html'} is as it was")
