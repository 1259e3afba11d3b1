"""Bad input, as a new user gives it: every case is one line on stderr that names the value and the
fix, exit code 2, no traceback, and no run folder started."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.results.store import RunWriter


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PARBENCH_TEST_SECRET_TOKEN": "hunter2"}
    return subprocess.run([sys.executable, "-m", "bench", *args], capture_output=True, text=True, timeout=120,
                          env=env, cwd=cwd)


def _run_folder(tmp: Path) -> Path:
    """A small, valid run folder written without running anything (for report and compare)."""
    d = tmp / "run"
    w = RunWriter(d)
    for i, (strategy, ws) in enumerate((("single", 1), ("ddp", 2))):
        w.append("cells", [{"cell_id": i, "workload": "mlp", "strategy": strategy, "backend": "gloo",
                            "world_size": ws, "device": "cpu", "precision": "fp32", "status": "ok",
                            "role": "reference" if ws == 1 else "data-parallel", "throughput_samples_s": 100.0}])
    (d / "meta.json").write_text(json.dumps({"run_id": "run", "config": {}}))
    return d


def _truncate_part(d: Path, table: str) -> None:
    part = sorted((d / f"{table}.parquet").glob("part-*.parquet"))[0]
    part.write_bytes(part.read_bytes()[:40])


def _empty_part(d: Path, table: str) -> None:
    (d / f"{table}.parquet").mkdir(exist_ok=True)
    (d / f"{table}.parquet" / "part-000099.parquet").write_bytes(b"")


def setup(tmp: Path, what: str) -> None:
    """Files a case needs, in ``tmp``."""
    if what == "file":
        (tmp / "afile").write_text("x")
    elif what == "fifo":
        os.mkfifo(tmp / "f")
    elif what == "bin-toml":
        (tmp / "c.toml").write_bytes(b"\xff\xfesteps = 1\n")
    elif what.startswith("toml:"):
        (tmp / "c.toml").write_text(what[5:].replace(";", "\n"))
    elif what == "history":  # a history store holding one run
        from bench.gate.history import add

        add(_run_folder(tmp), tmp / "hist", commit="abc")
    elif what.startswith("run"):
        d = _run_folder(tmp)
        kind = what.partition(":")[2]
        if kind == "truncated-cells":
            _truncate_part(d, "cells")
        elif kind == "empty-cells":
            _empty_part(d, "cells")
        elif kind == "empty-steps":
            _empty_part(d, "steps")
        elif kind == "meta-invalid":
            (d / "meta.json").write_text("{not json")
        elif kind == "meta-list":
            (d / "meta.json").write_text("[1, 2]")
        elif kind == "report-file":
            (tmp / "out.html").write_text("x")
        elif kind == "no-status":
            RunWriter(d, resume=True).append("cells", [{"cell_id": 7, "workload": "mlp", "strategy": "fsdp",
                                                        "backend": "gloo", "world_size": 2}])
        elif kind == "comm-folder":  # a collective sweep's folder: its own tables, no cells
            import shutil

            shutil.rmtree(d / "cells.parquet")
            (d / "collectives.parquet").mkdir()
        elif kind == "serve-folder":  # a serving run's folder: its cells are of mode serve
            import shutil

            shutil.rmtree(d / "cells.parquet")
            RunWriter(d, resume=True).append("cells", [{"cell_id": 0, "workload": "mlp", "strategy": "replicas",
                                                        "backend": "gloo", "world_size": 1, "mode": "serve",
                                                        "status": "ok"}])
        elif kind == "fifo-part":
            os.mkfifo(d / "cells.parquet" / "part-999999.parquet")
        elif kind == "negative-median":
            RunWriter(d, resume=True).append("cells", [{"cell_id": 8, "workload": "mlp", "strategy": "ddp",
                                                        "backend": "gloo", "world_size": 2, "status": "ok",
                                                        "step_time_median_s": -1.0}])
        elif kind == "no-meta":
            (d / "meta.json").unlink()


LONG = "x" * 300
RUN = "run"  # marks a `parbench run` case: --out {tmp}/out is added unless the case gives --out

CASES = [
    # --out
    ("out-is-file", "file", [RUN, "--out", "{tmp}/afile"], "--out '{tmp}/afile' is a file, not a folder"),
    ("out-under-file", "file", [RUN, "--out", "{tmp}/afile/sub"], "is not writable (a part of the path is a file)"),
    ("out-read-only", None, [RUN, "--out", "/proc/parbench-out"], "--out '/proc/parbench-out' is not writable"),
    ("out-300-chars", None, [RUN, "--out", "{tmp}/" + LONG], "over the file system's 255; pass a shorter"),
    # strategy options
    ("option-not-int", None, [RUN, "--option", "micro_batches=abc"],
     "option micro_batches='abc' must be an integer, e.g. micro_batches=8"),
    ("option-unknown-key", None, [RUN, "--strategies", "ddp", "--option", "nosuch=1"],
     "option 'nosuch' is not an option of the strategies in this run; known:"),
    ("option-no-equals", None, [RUN, "--option", "micro_batches"], "must be KEY=VALUE"),
    ("mesh-0x2", None, [RUN, "--option", "mesh=0x2"], "mesh '0x2': both degrees must be >= 1"),
    ("mesh-words", None, [RUN, "--option", "mesh=four"], "mesh 'four' must look like 2x2"),
    ("mesh-vs-world", None, [RUN, "--option", "mesh=2x4"], "mesh 2x4 has 8 ranks but world sizes are"),
    # TOML
    ("toml-steps-word", 'toml:steps = "five"', [RUN, "--config", "{tmp}/c.toml"], "steps='five' must be an integer"),
    ("toml-steps-float", "toml:steps = 2.7", [RUN, "--config", "{tmp}/c.toml"], "steps=2.7 must be an integer"),
    ("toml-warmup-bool", "toml:warmup = true", [RUN, "--config", "{tmp}/c.toml"], "warmup=True must be an integer"),
    ("toml-unknown-key", "toml:stepz = 3", [RUN, "--config", "{tmp}/c.toml"], "unknown setting 'stepz'"),
    ("toml-syntax", "toml:steps = = 3", [RUN, "--config", "{tmp}/c.toml"], "is not valid TOML"),
    ("toml-options-not-table", "toml:options = 3", [RUN, "--config", "{tmp}/c.toml"], "options must be a TOML table"),
    ("toml-lr-word", 'toml:lr = "fast"', [RUN, "--config", "{tmp}/c.toml"], "lr='fast' must be a number"),
    ("config-missing", None, [RUN, "--config", "/no/such.toml"], "config '/no/such.toml' not found"),
    # flags
    ("steps-0", None, [RUN, "--steps", "0"], "steps=0 must be >= 1"),
    ("warmup-negative", None, [RUN, "--warmup", "-1"], "warmup=-1 must be >= 0"),
    ("repeats-0", None, [RUN, "--repeats", "0"], "repeats=0 must be >= 1"),
    ("world-size-0", None, [RUN, "--world-sizes", "0"], "world sizes: 0 must be >= 1"),
    ("world-size-word", None, [RUN, "--world-sizes", "a"], "world sizes: 'a' is not an integer"),
    ("device-unknown", None, [RUN, "--device", "tpu"], "device 'tpu' unknown; use cpu or cuda"),
    ("device-cuda-no-gpu", None, [RUN, "--device", "cuda"], "no GPU visible; use --device cpu"),
    ("nccl-no-gpu", None, [RUN, "--backends", "nccl"], "--backends nccl: no GPU visible"),
    ("backend-unknown", None, [RUN, "--backends", "mpi"], "backend 'mpi' unknown"),
    ("precision-unknown", None, [RUN, "--precision", "fp16"], "precision 'fp16' unknown"),
    ("bf16-on-cpu", None, [RUN, "--precision", "bf16", "--device", "cpu"], "use --precision fp32 on cpu"),
    ("scaling-unknown", None, [RUN, "--scaling", "diagonal"], "scaling 'diagonal' unknown"),
    ("sample-hz-high", None, [RUN, "--sample-hz", "5000"], "must be 0 (off) or from 0.01 to 1000"),
    ("cell-timeout-0", None, [RUN, "--cell-timeout", "0"], "--cell-timeout 0: use seconds > 0"),
    ("budget-word", None, [RUN, "--budget", "soon"], "budget 'soon' is not a duration"),
    ("budget-0", None, [RUN, "--budget", "0"], "budget '0' must be longer than 0 s"),
    ("budget-empty", None, [RUN, "--budget", ""], "--budget '' is empty"),
    ("target-ci-high", None, [RUN, "--target-ci", "1.5"], "must be fractions in [0, 1)"),
    ("global-batch-0", None, [RUN, "--global-batch", "0"], "global batch 0 must be >= 1"),
    ("trace-without-profile", None, [RUN, "--trace", "--profile-steps", "0"], "--trace needs profiled steps"),
    # several nodes (docs/guides/multinode.md)
    ("nnodes-0", None, [RUN, "--nnodes", "0"], "--nnodes 0 must be >= 1"),
    ("node-rank-too-big", None, [RUN, "--nnodes", "2", "--node-rank", "2"], "--node-rank 2 must be from 0 to 1"),
    ("node-rank-negative", None, [RUN, "--nnodes", "2", "--node-rank", "-1"], "--node-rank -1 must be from 0 to 1"),
    ("node-rank-one-node", None, [RUN, "--node-rank", "1"], "--node-rank 1 must be from 0 to 0"),
    ("endpoint-no-port", None, [RUN, "--nnodes", "2", "--rdzv-endpoint", "node-a"],
     "--rdzv-endpoint 'node-a' must be HOST:PORT, e.g."),
    ("endpoint-port-word", None, [RUN, "--nnodes", "2", "--rdzv-endpoint", "node-a:http"],
     "port 'http' must be a number from 1 to 65535"),
    ("endpoint-port-high", None, [RUN, "--nnodes", "2", "--rdzv-endpoint", "node-a:70000"],
     "port '70000' must be a number from 1 to 65535"),
    ("endpoint-url", None, [RUN, "--nnodes", "2", "--rdzv-endpoint", "tcp://node-a:29400"], "must be HOST:PORT"),
    ("endpoint-one-node", None, [RUN, "--rdzv-endpoint", "node-a:29400"], "is for runs on several nodes; add --nnodes"),
    ("world-size-vs-nnodes", None, [RUN, "--nnodes", "2", "--world-sizes", "3"],
     "world size 3 is not divisible by --nnodes 2"),
    ("rdzv-timeout-0", None, [RUN, "--nnodes", "2", "--rdzv-timeout", "0"], "--rdzv-timeout 0.0 must be a finite"),
    ("rdzv-timeout-inf", None, [RUN, "--nnodes", "2", "--rdzv-timeout", "inf"], "--rdzv-timeout inf must be a finite"),
    ("resume-with-nnodes", "run", [RUN, "--resume", "{tmp}/run", "--nnodes", "2"], "drop --nnodes"),
    ("slurm-nodes-0", None, ["slurm", "--nodes", "0", "--gpus-per-node", "1"], "--nodes 0 must be >= 1"),
    ("slurm-nodes-huge", None, ["slurm", "--nodes", "99999999999999999999", "--gpus-per-node", "0", "--device", "cpu"],
     "--nodes 99999999999999999999 x --gpus-per-node 0 is more than 65,536 devices"),
    ("slurm-devices-huge", None, ["slurm", "--nodes", "70000", "--gpus-per-node", "8"], "is more than 65,536 devices"),
    ("slurm-script-fifo", "fifo", ["slurm", "--nodes", "2", "--gpus-per-node", "0", "--device", "cpu", "--script",
                                   "{tmp}/f"], "is not a regular file (a pipe or a device)"),
    ("slurm-time-huge", None, ["slurm", "--nodes", "2", "--gpus-per-node", "0", "--device", "cpu", "--time",
                               "99999999999999"], "--time '99999999999999' is more than a year"),
    ("slurm-time-days-huge", None, ["slurm", "--nodes", "2", "--gpus-per-node", "0", "--device", "cpu", "--time",
                                    "400-00:00:00"], "is more than a year"),
    ("config-is-folder", None, [RUN, "--config", "{tmp}"], "is a folder; pass a TOML file"),
    ("config-is-fifo", "fifo", [RUN, "--config", "{tmp}/f"], "is not a regular file (a pipe or a device)"),
    ("slurm-world-size", None, ["slurm", "--nodes", "2", "--gpus-per-node", "0", "--device", "cpu", "--world-sizes",
                                "3"], "world size 3 is not divisible by --nnodes 2"),
    ("slurm-cuda-without-gpus", None, ["slurm", "--nodes", "2", "--gpus-per-node", "0", "--device", "cuda"],
     "--gpus-per-node 0 with a CUDA run"),
    # the nodes' planning checks, before the queue: a typo waited for its nodes, then failed on them
    ("slurm-strategy-unknown", None, ["slurm", "--nodes", "2", "--gpus-per-node", "0", "--device", "cpu",
                                      "--strategies", "zero3"], "unknown strategy 'zero3'"),
    ("slurm-workload-unknown", None, ["slurm", "--nodes", "2", "--gpus-per-node", "0", "--device", "cpu",
                                      "--workloads", "nope"], "unknown workload 'nope'"),
    # workloads and strategies
    ("workload-unknown", None, [RUN, "--workloads", "nope"], "unknown workload 'nope'"),
    ("workload-dim-not-int", None, [RUN, "--workloads", "gpt-tiny[d_model=x]"], "must be key=<integer>"),
    ("workload-brackets", None, [RUN, "--workloads", "gpt-tiny[d_model=8"], "write dimensions as name[key=value"),
    ("workload-factory-raises", None, [RUN, "--workloads", "tests.helpers:factory_raises"],
     "its factory raised RuntimeError: deliberate failure in the factory [/x]"),
    ("workload-no-module", None, [RUN, "--workloads", "no_such_pkg:f"], "cannot import 'no_such_pkg'"),
    ("workload-no-callable", None, [RUN, "--workloads", "tests.helpers:nothing"], "has no callable 'nothing'"),
    ("workload-batch-0", None, [RUN, "--workloads", "tests.helpers:global_batch_zero"],
     "its factory built global_batch=0; it must be an integer >= 1"),
    ("workload-factory-exits", None, [RUN, "--workloads", "tests.helpers:factory_exits"],
     "workload 'tests.helpers:factory_exits': its factory factory_exits() called sys.exit(3); a factory returns"),
    ("workload-factory-os-exit", None, [RUN, "--workloads", "tests.helpers:factory_os_exit"],
     "workload 'tests.helpers:factory_os_exit': its factory factory_os_exit() ended the process (exit code 7) while "
     "the run was planned"),
    ("workload-factory-crashes", None, [RUN, "--workloads", "tests.helpers:factory_crashes"],
     "its factory factory_crashes() ended the process (killed by SIGSEGV) while the run was planned"),
    ("workload-batch-short", None, [RUN, "--workloads", "tests.helpers:short_batch"],
     "workload 'tests.helpers:short_batch': batch(0) returned 6 samples, but the workload's global batch is 16"),
    ("strategy-unknown", None, [RUN, "--strategies", "zero3"], "unknown strategy 'zero3'"),
    # not finite: refused up front (otherwise every cell fails inside its ranks and the run exits 0)
    ("time-cap-nan", None, [RUN, "--time-cap", "nan"], "--time-cap nan must be a finite number"),
    ("time-cap-inf", None, [RUN, "--time-cap", "inf"], "--time-cap inf must be a finite number"),
    ("cell-timeout-inf", None, [RUN, "--cell-timeout", "inf"], "--cell-timeout inf must be a finite number"),
    ("time-cap-negative", None, [RUN, "--time-cap", "-1"], "--time-cap -1 must be >= 0 seconds"),
    # resume
    ("resume-missing", None, [RUN, "--resume", "/no/such/run"], "--resume '/no/such/run' is not a parbench run"),
    ("resume-with-flags", "run", [RUN, "--resume", "{tmp}/run", "--steps", "3"], "drop --steps"),
    ("resume-no-config", "run", [RUN, "--resume", "{tmp}/run"], "meta.json has no config"),
    # report and compare on damaged run folders
    ("report-missing", None, ["report", "/no/such/run"], "not a parbench run folder"),
    ("report-truncated-cells", "run:truncated-cells", ["report", "{tmp}/run"], "cannot be read"),
    ("report-empty-cells-part", "run:empty-cells", ["report", "{tmp}/run"], "part-000099.parquet cannot be read"),
    ("report-empty-steps-part", "run:empty-steps", ["report", "{tmp}/run"], "part-000099.parquet cannot be read"),
    ("report-meta-invalid", "run:meta-invalid", ["report", "{tmp}/run"], "meta.json is not valid JSON"),
    ("report-meta-list", "run:meta-list", ["report", "{tmp}/run"], "holds a JSON list, not an object"),
    ("report-onto-file", "run:report-file", ["report", "{tmp}/run", "-o", "{tmp}/out.html"],
     "-o '{tmp}/out.html' is an existing file"),
    ("compare-truncated", "run:truncated-cells", ["compare", "{tmp}/run", "{tmp}/run"], "cannot be read"),
    ("compare-meta-list", "run:meta-list", ["compare", "{tmp}/run", "{tmp}/run"], "holds a JSON list"),
    # a folder of another kind: said what it is and what the command reads
    ("report-comm-folder", "run:comm-folder", ["report", "{tmp}/run"], "{tmp}/run is a collective sweep's folder"),
    ("compare-comm-folder", "run:comm-folder", ["compare", "{tmp}/run", "{tmp}/run"], "(parbench comm), which has"),
    ("compare-serve-folder", "run:serve-folder", ["compare", "{tmp}/run", "{tmp}/run"],
     "{tmp}/run is a serving run's folder (parbench serve): compare reads the step times"),
    ("export-serve-folder", "run:serve-folder", ["export", "{tmp}/run", "--format", "pytest-benchmark", "-o",
                                                "{tmp}/e.json"], "is a serving run's folder (parbench serve): export"),
    # a FIFO among the part files blocked report for ever (and SIGTERM did not end it)
    ("report-fifo-part", "run:fifo-part", ["report", "{tmp}/run"],
     "part-999999.parquet is not a regular file (a pipe, a device or a folder)"),
    ("report-negative-median", "run:negative-median", ["report", "{tmp}/run"],
     "cells.parquet: step_time_median_s of cell 8 is -1.0, not a time (finite and >= 0)"),
    ("compare-no-status", "run:no-status", ["compare", "{tmp}/run", "{tmp}/run"], "cell(s) 7 have no status"),
    ("report-no-status", "run:no-status", ["report", "{tmp}/run"], "cell(s) 7 have no status"),
    ("compare-missing", None, ["compare", "/a", "/b"], "not a parbench run folder"),
    # outputs never land on a run's own files, nor two outputs on one file
    ("export-over-meta", "run", ["export", "{tmp}/run", "--format", "pytest-benchmark", "-o", "{tmp}/run/meta.json"],
     "-o '{tmp}/run/meta.json' is inside the run folder {tmp}/run, whose files only the run writes"),
    ("export-into-run", "run", ["export", "{tmp}/run", "--format", "pytest-benchmark", "-o", "{tmp}/run/b.json"],
     "or under {tmp}/run/report"),
    ("compare-json-over-markdown", "run", ["compare", "{tmp}/run", "{tmp}/run", "--json", "{tmp}/o.txt",
                                           "--markdown", "{tmp}/o.txt"], "both name '{tmp}/o.txt'"),
    ("compare-json-into-run", "run", ["compare", "{tmp}/run", "{tmp}/run", "--json", "{tmp}/run/c.json"],
     "--json '{tmp}/run/c.json' is inside the run folder"),
    ("report-into-run-itself", "run", ["report", "{tmp}/run", "-o", "{tmp}/run"], "is inside the run folder"),
    # output files that cannot be written: refused before the work, not a traceback after it
    ("report-out-unwritable", "run", ["report", "{tmp}/run", "-o", "/proc/parbench-report"],
     "report output '/proc/parbench-report' cannot be written"),
    ("compare-markdown-no-folder", "run", ["compare", "{tmp}/run", "{tmp}/run", "--markdown", "{tmp}/no/s.md"],
     "--markdown '{tmp}/no/s.md' cannot be written (folder '{tmp}/no' does not exist)"),
    ("compare-junit-under-file", "run", ["compare", "{tmp}/run", "{tmp}/run", "--junit", "{tmp}/run/meta.json/j.xml"],
     "--junit '{tmp}/run/meta.json/j.xml' cannot be written"),
    ("compare-json-is-folder", "run", ["compare", "{tmp}/run", "{tmp}/run", "--json", "{tmp}/run"],
     "--json '{tmp}/run' cannot be written (it is a folder)"),
    ("history-store-unwritable", "run", ["history", "add", "{tmp}/run", "--commit", "abc", "--store",
                                         "/proc/parbench-hist"], "--store '/proc/parbench-hist' cannot be written"),
    ("history-store-under-file", "run", ["history", "add", "{tmp}/run", "--commit", "abc", "--store",
                                         "{tmp}/run/meta.json"], "cannot be written (Not a directory)"),
    ("history-plots-unwritable", "history",
     ["history", "show", "--store", "{tmp}/hist", "--plots", "/proc/parbench-plots"],
     "--plots '/proc/parbench-plots' cannot be written"),
    ("comm-out-unwritable", None, ["comm", "--device", "cpu", "--out", "/proc/parbench-comm"],
     "--out '/proc/parbench-comm' is not writable"),
    # counts past any measurement: refused up front (--steps 1e20 would overflow the tables after the cells ran)
    ("steps-huge", None, [RUN, "--steps", "99999999999999999999"], "steps=99999999999999999999 is more than 1,000,000"),
    ("repeats-huge", None, [RUN, "--repeats", "5000000"], "repeats=5000000 is more than 1,000,000"),
    ("steps-max-huge", None, [RUN, "--steps-max", "2000000"], "steps_max=2000000 is more than 1,000,000"),
    ("seed-huge", None, [RUN, "--seed", "99999999999999999999"], "seed=99999999999999999999 must be from 0 to 2**40"),
    # the per-step data seed (seed * 1_000_003 + step) would overflow 64 bits inside every rank
    ("seed-past-2-40", None, [RUN, "--seed", "4611686018427387904"], "(each step's data seed is derived from it"),
    ("world-size-huge", None, [RUN, "--world-sizes", "99999999999999999999"], "is more than 65,536 (a typo?)"),
    ("workload-dim-huge", None, [RUN, "--workloads", "mlp[width=99999999999]"],
     "width=99999999999 is more than 2,147,483,647 (a typo?)"),
    ("toml-not-utf8", "bin-toml", [RUN, "--config", "{tmp}/c.toml"], "is not UTF-8 text (byte 0); save it as UTF-8"),
    ("toml-nested-2000", "toml:a = " + "[" * 2000 + "]" * 2000, [RUN, "--config", "{tmp}/c.toml"],
     "nests its tables or arrays too deep"),
    ("sample-hz-1e-300", None, [RUN, "--sample-hz", "1e-300"], "must be 0 (off) or from 0.01 to 1000"),
    ("option-nan", None, [RUN, "--option", "bucket_mb=nan"], "option 'bucket_mb=nan': nan is not a finite number"),
    ("lr-1e300", None, [RUN, "--lr", "1e300"], "lr=1e+300 must be > 0 and at most 100"),
    ("compare-threshold-word", None, ["compare", "/a", "/b", "--threshold", "x"], "threshold 'x'"),
    # a cap below its count would silently be a fixed count; an empty --out would write into the
    # current folder; a numeric endpoint that is no address would wait out the store's 60 s connect timeout
    ("steps-max-below-steps", None, [RUN, "--steps", "5", "--steps-max", "2"], "steps_max=2 is below steps=5"),
    ("warmup-max-below-warmup", None, [RUN, "--warmup", "4", "--warmup-max", "2"], "warmup_max=2 is below warmup=4"),
    ("out-empty", None, [RUN, "--out", ""], "out '' is empty"),
    ("rdzv-not-an-address", None, [RUN, "--nnodes", "2", "--rdzv-endpoint", "256.1.1.1:29400"],
     "'256.1.1.1' is not an IP address"),
    ("workload-dim-zero", None, [RUN, "--workloads", "mlp[width=0]"], "workload 'mlp': width=0 must be >= 1"),
    ("workload-layers-zero", None, [RUN, "--workloads", "gpt-tiny[n_layer=0]"], "n_layer=0 must be >= 1"),
    # comm: an empty list ran the defaults, a negative budget ran, 100G on CPU met the OOM killer
    ("comm-ops-empty", None, ["comm", "--device", "cpu", "--ops", ""], "--ops is empty"),
    ("comm-budget-negative", None, ["comm", "--device", "cpu", "--budget", "-1"], "--budget -1: use seconds"),
    ("comm-max-bytes-huge", None, ["comm", "--device", "cpu", "--max-bytes", "100G"],
     "--max-bytes 100G needs about 600.0 GiB for 2 ranks on this host"),
    # flag combinations that would otherwise be ignored silently, hang or mislead
    ("profile-at-without-steps", None, [RUN, "--profile-steps", "0", "--profile-at", "end"],
     "--profile-at end needs profiled steps; drop --profile-steps 0 or --profile-at"),
    ("steps-max-negative", None, [RUN, "--steps-max", "-3"], "--steps-max -3 must be >= 0 (0: exactly --steps)"),
    ("warmup-max-negative", None, [RUN, "--warmup-max", "-1"], "--warmup-max -1 must be >= 0"),
    ("rdzv-endpoint-empty", None, [RUN, "--nnodes", "2", "--rdzv-endpoint", ""], "--rdzv-endpoint '' is empty"),
    ("workload-dim-negative", None, [RUN, "--workloads", "mlp[width=-1]"], "width=-1 must be >= 1"),
    ("comm-world-too-big", None, ["comm", "--device", "cpu", "--world-sizes", "100000"],
     "--world-sizes 100000: more ranks than 4 x"),
    ("comm-budget-huge", None, ["comm", "--device", "cpu", "--budget", "1e9"], "--budget 1e+09: use seconds per point"),
    ("serve-sweep-rates-zero", None, ["serve", "--device", "cpu", "--slo-ms", "100", "--sweep-rates", "0"],
     "--sweep-rates 0: rates must be positive"),
    ("serve-sweep-rates-no-slo", None, ["serve", "--device", "cpu", "--sweep-rates", "10,20"],
     "--sweep-rates needs a latency target"),
    ("serve-sweep-too-short", None, ["serve", "--device", "cpu", "--slo-ms", "50"],
     "a p99 needs 662; pass --requests 700"),
]


def argv_of(name: str, args: list[str], tmp: Path) -> list[str]:
    argv = [a.replace("{tmp}", str(tmp)) for a in args]
    if argv[0] == RUN:
        argv[0] = "run"
        if "--out" not in argv and "--resume" not in argv:
            argv += ["--out", str(tmp / "out")]
        if "--device" not in argv and name != "nccl-no-gpu" and "--resume" not in argv:
            argv += ["--device", "cpu"]
    return argv


def in_process(argv: list[str], capsys) -> tuple[int, str]:
    """bench.cli.main.main in this process (the same code path as the command, without paying a
    Python + torch start per case on a loaded 2-core machine); argparse's exits count as codes."""
    from bench.cli.main import main

    capsys.readouterr()
    try:
        code = main(argv)
    except SystemExit as e:
        code = e.code
    return code, capsys.readouterr().err


@pytest.mark.parametrize("name, prep, args, needle", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_exit_2(tmp_path, capsys, name, prep, args, needle):
    if prep:
        setup(tmp_path, prep)
    argv = argv_of(name, args, tmp_path)
    before = {p for p in tmp_path.rglob("*")}
    code, err = in_process(argv, capsys)
    err = err.strip()
    assert code == 2, (code, err[-2000:])
    assert "Traceback" not in err and len(err.splitlines()) == 1, err[-2000:]
    assert err.startswith("parbench: error: ")
    assert needle.replace("{tmp}", str(tmp_path)) in err, err
    new = {p for p in tmp_path.rglob("*")} - before
    assert not [p for p in new if p.name == "meta.json"], new  # no run folder was started


#: A few cases through the real command, in a process of its own: exit status, stderr, no traceback.
#: Every case also runs in-process above; one per command family runs in the default suite (each
#: process pays a Python and torch start), the rest with -m slow.
SUBPROCESS = ("out-is-file",)
SUBPROCESS_SLOW = ("workload-factory-raises", "report-truncated-cells", "endpoint-no-port", "toml-steps-float",
                   "device-cuda-no-gpu", "report-onto-file", "node-rank-too-big")


@pytest.mark.parametrize("name", [*SUBPROCESS, *(pytest.param(n, marks=pytest.mark.slow) for n in SUBPROCESS_SLOW)])
def test_bad_input_through_the_command(tmp_path, name):
    _, prep, args, needle = next(c for c in CASES if c[0] == name)
    if prep:
        setup(tmp_path, prep)
    r = cli(*argv_of(name, args, tmp_path), cwd=Path(__file__).parents[2])
    err = r.stderr.strip()
    assert r.returncode == 2, (r.returncode, err[-2000:])
    assert "Traceback" not in err and len(err.splitlines()) == 1, err[-2000:]
    assert needle.replace("{tmp}", str(tmp_path)) in err, err


def test_cases_are_many_and_distinct():
    assert len(CASES) >= 40 and len({c[0] for c in CASES}) == len(CASES)


def test_disk_full_keeps_parts_whole_and_says_so_in_one_line(tmp_path, monkeypatch):
    """ENOSPC while a part is written: a one-line UserError naming the fix, the parts written
    before are kept, no temporary file is left."""
    import errno

    import pyarrow.parquet as pq

    from bench.core.errors import UserError
    from bench.results.store import read_table

    w = RunWriter(tmp_path / "run")
    w.append("cells", [{"cell_id": 0, "workload": "mlp", "strategy": "single", "backend": "gloo", "world_size": 1,
                        "status": "ok"}])
    real = pq.write_table

    def full(table, where, *a, **k):
        Path(where).write_bytes(b"PAR1 half")  # what a full disk leaves: a partial file
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(pq, "write_table", full)
    with pytest.raises(UserError, match=r"No space left on device.*finished cells are kept.*--resume") as e:
        w.append("cells", [{"cell_id": 1, "workload": "mlp", "strategy": "ddp", "backend": "gloo", "world_size": 2,
                            "status": "ok"}])
    assert "\n" not in str(e.value)
    monkeypatch.setattr(pq, "write_table", real)
    assert not list((tmp_path / "run").rglob("*.tmp"))
    assert read_table(tmp_path / "run", "cells")["cell_id"].tolist() == [0]


def test_meta_json_full_disk_is_a_user_error(tmp_path, monkeypatch):
    import errno

    from bench.core.errors import UserError
    from bench.results.store import write_meta

    d = tmp_path / "run"
    d.mkdir()

    def full(self, *a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Path, "write_text", full)
    with pytest.raises(UserError, match="cannot write .*meta.json .No space left on device"):
        write_meta(d, {})
    assert not list(d.iterdir())


def test_no_secret_looking_variable_reaches_meta_or_report(tmp_path, monkeypatch):
    """meta.json keeps allowlisted variables only: a token-like name never appears."""
    from bench.results.store import write_meta

    monkeypatch.setenv("PARBENCH_API_TOKEN", "hunter2-token")
    monkeypatch.setenv("NCCL_SECRET_KEY", "hunter2-key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "hunter2-aws")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    d = tmp_path / "run"
    d.mkdir()
    meta = write_meta(d, {})
    text = (d / "meta.json").read_text()
    assert "hunter2" not in text and "TOKEN" not in text and "SECRET" not in text
    assert json.loads(text)["fingerprint"]["env"].get("OMP_NUM_THREADS") == "1" or "OMP_NUM_THREADS" in text
    assert meta["run_id"] == "run"


def test_a_budget_plan_with_no_time_cap_says_so():
    """`--time-cap 0` (no cap) under a budget was planned as "stops adding steps after 0.0s"."""
    from bench.core.config import build_config
    from bench.plan.budget import budget_plan
    from bench.plan.matrix import plan

    cfg = build_config(toml=None, flags={"workloads": "mlp", "strategies": "single", "world_sizes": "1",
                                         "budget": "1m", "time_cap_s": 0, "target_ci": 0, "device": "cpu"}, gpus=0)
    cells, _, _ = plan(cfg, 0)
    _, text = budget_plan(cfg, cells, 60.0)
    assert "has no time cap (--time-cap 0)" in text and "after 0.0s" not in text and "within 0%" not in text


def test_a_long_budget_is_a_budget():
    """`--budget 99999h` was refused as "budget '3.59996e+08s' is not a duration": the checked budget
    was stored in scientific notation and parsed again."""
    from bench.core.config import build_config
    from bench.core.values import parse_duration

    assert parse_duration("99999h") == 99999 * 3600
    cfg = build_config(toml=None, flags={"workloads": "mlp", "budget": "99999h", "device": "cpu"}, gpus=0)
    assert parse_duration(cfg.budget.duration) == 99999 * 3600
    assert parse_duration("1e-07s") == 1e-07  # a tiny budget is a budget; the plan says it is too small


def test_argparse_errors_are_one_line_with_the_fix(capsys):
    """argparse printed its whole usage before the error; a negative value read as a flag got no hint."""
    from bench.cli.main import main

    with pytest.raises(SystemExit) as e:
        main(["compare", "a", "b", "--threshold", "-5%"])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and "\n" not in err, err
    assert "goes as --threshold=VALUE" in err and err.endswith("see parbench compare -h")
    for argv in (["run", "--steps"], ["run", "--steps", "--warmup", "-5"]):  # no hint: --steps took no value
        with pytest.raises(SystemExit):
            main(argv)
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and "goes as" not in err and "expected one argument" in err
    # an unknown flag is named by the subcommand it was given to, with that subcommand's help
    for argv, prog in ((["run", "--bogus", "1"], "parbench run"), (["history", "show", "--bogus"],
                                                                    "parbench history show")):
        with pytest.raises(SystemExit):
            main(argv)
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"{prog}: error: unrecognized arguments: --bogus") and err.endswith(f"see {prog} -h")
    # a choice that is not one: named, with the choices, before anything runs
    assert main(["run", "--profile-at", "later"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "profile_at 'later' unknown; use auto, end, inline" in err


def test_a_run_folder_has_one_writer(tmp_path, capsys):
    """Two `run --resume` of one folder at once both measured the missing cells and wrote both
    sets of rows: the second writer is refused in one line that names the holder, before it reads
    or writes anything; once the first ends, the folder can be resumed."""
    import json

    from bench.core.config import build_config
    from bench.results.lock import RunLock

    d = _run_folder(tmp_path)
    meta = json.loads((d / "meta.json").read_text())
    meta["config"] = build_config(toml=None, flags={"workloads": "mlp", "strategies": "single", "world_sizes": "1",
                                                    "device": "cpu", "out": str(tmp_path)}, gpus=0).flat()
    (d / "meta.json").write_text(json.dumps(meta))
    held = RunLock(d, "parbench run --resume (a test)")
    before = sorted(p.name for p in d.rglob("*"))
    try:
        code, err = in_process(["run", "--resume", str(d)], capsys)
    finally:
        held.release()
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert f"{d} is being written by parbench run --resume (a test) (pid {os.getpid()}" in err, err
    assert sorted(p.name for p in d.rglob("*")) == before
    again = RunLock(d, "after")  # released: the next writer gets it
    again.release()


def test_a_file_system_without_locks_warns_and_writes(tmp_path, monkeypatch, caplog):
    """Lustre without -o flock (and some NFS and FUSE mounts) answer flock with ENOSYS: the run goes
    on, saying the folder is not locked, instead of a traceback."""
    import errno
    import fcntl

    from bench.results.lock import RunLock

    def no_flock(fd, op):
        raise OSError(errno.ENOSYS, "Function not implemented")

    monkeypatch.setattr(fcntl, "flock", no_flock)
    with caplog.at_level("WARNING", logger="parbench"):
        RunLock(tmp_path, "parbench run").release()
    assert "this file system does not lock files (Function not implemented)" in caplog.text
