"""Several plain programs, one after another, in one set of rank processes.

    RANK=.. WORLD_SIZE=.. MASTER_ADDR=.. python -m tools.baselines.plain_many --ports 29501,29502 \\
        --program "plain_ddp --steps 20" --program "plain_fsdp --no-mp --steps 20"

Each ``--program`` is a plain program of this folder and its flags. It runs exactly as it would alone
(its own ``main()``: its own process group, started from the environment with the next port of
``--ports``, torn down at its end, and its one JSON line on stdout), but the interpreter, the
``import torch`` and the CUDA context are paid once, not once per program: on a GPU host that is
~5-8 s of the ~11 s a plain program takes to start, enough to keep a 3-round interleave of six
families inside one 10-minute device call. What the timed steps measure is unchanged: the
loop, its warm-up and its timing are each program's own; between programs the caching allocator
is emptied, the garbage collected and dynamo's caches reset, so one program's memory does not
shape the next one's and a program run with ``--compile`` compiles its own model (its ``compile_s``
is its own; only inductor's on-disk cache, which a lone program finds as well, is shared).

The flags of a program are its own (``plain_ddp --optimizer sgd --compile --ac selective``, ...):
each ``--program`` string is split (``shlex``) and handed to that program's parser unchanged.

Under torchrun, pass ``--ports`` (free ports, one per program): each program's group then gets a
store of its own. (The flag is ``--program``, not ``--run``: under torchrun, argparse would take ``--run`` as an
abbreviation of torchrun's own ``--run-path``.)

Before each program rank 0 prints ``{"plain_many_index": i, "program": ...}``: the lines up to the
next marker are program i's, so a reader never credits one program's line to another.

A program that fails prints ``{"plain_many_error": ...}`` on rank 0 and the next one still runs
(its process group is torn down first where it exists); the exit code is 1 if any failed.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import os
import shlex
import sys
import traceback


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--program", action="append", required=True, metavar="'PROGRAM FLAGS...'",
                    help="a plain program (plain_ddp, plain_fsdp, plain_pipeline, plain_tp) and its flags")
    ap.add_argument("--ports", default="", help="comma list, one MASTER_PORT per --program (default: MASTER_PORT)")
    args = ap.parse_args(argv)
    ports = [p for p in args.ports.split(",") if p]
    if ports and len(ports) != len(args.program):
        ap.error(f"--ports has {len(ports)} entries for {len(args.program)} --program")
    import torch
    import torch.distributed as dist

    failed = 0
    for i, run in enumerate(args.program):
        prog, *flags = shlex.split(run)
        if prog not in ("plain_ddp", "plain_fsdp", "plain_pipeline", "plain_tp"):
            ap.error(f"--program {prog!r}: not a plain program of tools/baselines")
        if ports:
            os.environ["MASTER_PORT"] = ports[i]
            # Under torchrun each group would otherwise reuse the agent's store, whose keys the
            # previous program's group left behind: rank 0 hosts a fresh store on this port instead.
            os.environ["TORCHELASTIC_USE_AGENT_STORE"] = "False"
        if os.environ.get("RANK", "0") == "0":  # the lines up to the next marker are this program's
            print(json.dumps({"plain_many_index": i, "program": prog}), flush=True)
        mod = importlib.import_module(f"tools.baselines.{prog}")
        sys.argv = [f"tools.baselines.{prog}", *flags]
        try:
            mod.main()
        except SystemExit as e:  # argparse errors: a bad --program is the caller's bug, say which
            if e.code:
                failed += 1
                _error(prog, flags, f"exit {e.code}")
        except Exception as e:  # noqa: BLE001 - report it and go on with the next program
            failed += 1
            _error(prog, flags, f"{type(e).__name__}: {e}")
            traceback.print_exc(file=sys.stderr)
            if dist.is_initialized():
                dist.destroy_process_group()
        if "torch._dynamo" in sys.modules:  # a compiled program ran: its guards and graphs go with it
            torch._dynamo.reset()
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return 1 if failed else 0


def _error(prog: str, flags: list[str], msg: str) -> None:
    if os.environ.get("RANK", "0") == "0":
        print(json.dumps({"plain_many_error": msg, "program": prog, "flags": flags}), flush=True)


if __name__ == "__main__":
    sys.exit(main())
