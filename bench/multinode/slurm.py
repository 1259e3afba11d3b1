"""An sbatch script for a multi-node run: srun starts one parbench launcher per node.

The script asks Slurm for ``nodes`` nodes with one task each (and ``gpus_per_node`` GPUs), takes
the first host of the allocation as the rendezvous endpoint (its launcher is node 0: Slurm numbers
the nodes of a step from the first host, and ``SLURM_NODEID`` becomes ``--node-rank``), and runs
``parbench run`` on every node with the same flags, into a results folder that must be on storage
every node sees (node 0 writes the tables there, every node its logs). ``srun --kill-on-bad-exit``
stops the other nodes when one fails, so nothing is left running on the allocation.

Every value of an ``#SBATCH`` line is checked when the job is made (:class:`SlurmJob`), because
sbatch reads those lines with rules of its own, not the shell's: a newline would end the line and
start a line of shell in the script, an unquoted space or ``#`` would cut the value short. Names
(job, partition, account) are single tokens; the time is one of Slurm's formats; paths are written
in double quotes, which sbatch accepts, and a path it cannot take that way is refused with the fix.
The script's body is shell and quotes every value with :func:`shlex.quote`.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from bench.core.errors import UserError
from bench.runtime.process import run_tree

#: Slurm's time limit formats: minutes, minutes:seconds, hours:minutes:seconds, days-hours,
#: days-hours:minutes, days-hours:minutes:seconds (sbatch --time)
TIME = re.compile(r"\d+(:\d+){0,2}|\d+-\d+(:\d+){0,2}", re.ASCII)
#: a job, partition or account name (a partition may be a comma list): no whitespace, quotes,
#: backslash, '#' or control characters, which sbatch's line parser or the shell would take apart
NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.,:+@=/-]*", re.ASCII)
#: characters no path in an #SBATCH line may hold: sbatch ends the line at a newline, takes '"'
#: and '\' as its own quoting, and expands '%' in --output as a file name pattern
PATH_REFUSED = re.compile(r'[\x00-\x1f\x7f"\\%]')


#: the longest --time taken: a year (a longer limit is a typo; Slurm's own UNLIMITED is the partition's)
TIME_MAX_S = 366 * 86400


def time_seconds(text: str) -> int:
    """Seconds of a limit in one of Slurm's time formats (already matched by :data:`TIME`)."""
    days, _, rest = text.rpartition("-")
    parts = [int(x) for x in rest.split(":")]
    if days:  # D-HH, D-HH:MM, D-HH:MM:SS
        h, m, sec = (parts + [0, 0])[:3]
        return int(days) * 86400 + h * 3600 + m * 60 + sec
    if len(parts) == 3:  # HH:MM:SS
        return parts[0] * 3600 + parts[1] * 60 + parts[2]
    return parts[0] * 60 + (parts[1] if len(parts) == 2 else 0)  # minutes, MM:SS


def check_time(text: str) -> str:
    """``text`` if it is one of Slurm's time formats within a year, else a one-line UserError."""
    if not TIME.fullmatch(text):
        raise UserError(f"--time {text!r} is not a Slurm time limit; use minutes (30), MM:SS, HH:MM:SS (00:30:00), "
                        "D-HH, D-HH:MM or D-HH:MM:SS (1-12:00:00)")
    if len(text) > 20 or time_seconds(text) > TIME_MAX_S:
        raise UserError(f"--time {text!r} is more than a year (a typo?); e.g. --time 1-12:00:00")
    return text


def check_name(flag: str, text: str) -> str:
    """``text`` if it is one token sbatch reads as given, else a one-line UserError."""
    if not NAME.fullmatch(text):
        raise UserError(f"{flag} {text!r} must be one word of letters, digits and _ . , : + @ = / - (no spaces, "
                        f"quotes, '#' or control characters), e.g. {flag} gpu")
    return text


def check_path(what: str, text: str, fix: str) -> str:
    """``text`` if an #SBATCH line can hold it in double quotes, else a one-line UserError (``what``:
    the flag or folder it comes from, ``fix``: what to do instead)."""
    bad = PATH_REFUSED.search(text)
    if bad:
        raise UserError(f"{what} {text!r} has {bad.group()!r}, which an #SBATCH line cannot hold; {fix}")
    return text


def check_shell_path(what: str, text: str, fix: str) -> str:
    """``text`` if it is a non-empty path without control characters (it goes into the script's
    body, quoted; a newline there is legal shell but never a real interpreter or folder)."""
    if not text or re.search(r"[\x00-\x1f\x7f]", text):
        raise UserError(f"{what} {text!r} must be a path without newlines or control characters; {fix}")
    return text


@dataclass(frozen=True, kw_only=True)
class SlurmJob:
    """One multi-node run as a batch job; every value is checked here (a one-line UserError), so
    that :func:`render` cannot write a line the caller did not mean."""

    nodes: int
    gpus_per_node: int
    run_args: list[str]  # parbench run flags, passed on as given (matrix, measurement)
    out: str  # absolute results folder on shared storage
    python: str  # the interpreter that has parbench installed, on every node
    workdir: str  # where the job starts (the checkout, or anywhere when parbench is installed)
    port: int = 29400
    job_name: str = "parbench"
    time: str | None = None
    partition: str | None = None
    account: str | None = None
    cpus_per_task: int | None = None

    def __post_init__(self) -> None:
        if self.nodes < 1:
            raise UserError(f"--nodes {self.nodes} must be >= 1; e.g. --nodes 2")
        if self.gpus_per_node < 0:
            raise UserError(f"--gpus-per-node {self.gpus_per_node} must be >= 0 (0 for a CPU run)")
        if not 1 <= self.port <= 65535:
            raise UserError(f"--port {self.port} must be from 1 to 65535, e.g. --port 29400")
        if self.cpus_per_task is not None and self.cpus_per_task < 1:
            raise UserError(f"--cpus-per-task {self.cpus_per_task} must be >= 1, e.g. --cpus-per-task 16")
        self.sbatch_lines()  # the checks of the #SBATCH values
        check_shell_path("--python", self.python, "pass the interpreter's path as every node sees it")

    def sbatch_lines(self) -> list[str]:
        """The #SBATCH options, each value checked (and paths quoted) for sbatch's line parser."""
        # --exclusive: a benchmark wants whole nodes (other jobs' load would be measured as its own), and
        # some clusters give a task one CPU unless asked; srun gets --cpus-per-task itself where set.
        out = check_path("--out", self.out, "pass a results folder without it, e.g. --out /shared/results")
        workdir = check_path("the current folder", self.workdir,
                             "run parbench slurm from a folder without it (the job starts in this folder)")
        sb = [f"--job-name={check_name('--job-name', self.job_name)}", f"--nodes={self.nodes}",
              "--ntasks-per-node=1", "--exclusive", f'--output="{out}/slurm-%j.out"', f'--chdir="{workdir}"']
        if self.gpus_per_node:
            sb.append(f"--gpus-per-node={self.gpus_per_node}")
        if self.time is not None:
            sb.append(f"--time={check_time(self.time)}")
        for key, value in (("partition", self.partition), ("account", self.account)):
            if value is not None:
                sb.append(f"--{key}={check_name(f'--{key}', value)}")
        if self.cpus_per_task is not None:
            sb.append(f"--cpus-per-task={self.cpus_per_task}")
        return sb


def render(job: SlurmJob) -> str:
    """The sbatch script's text."""
    # Expanded by the shell of each node's task, not by the batch script: node rank and endpoint.
    nodes = (f'--nnodes {job.nodes} --node-rank "$SLURM_NODEID" --rdzv-endpoint "$PARBENCH_RDZV_ENDPOINT" '
             if job.nodes > 1 else "")
    inner = (f"exec {shlex.quote(job.python)} -m bench run {nodes}--out {shlex.quote(job.out)} --no-progress"
             + "".join(f" {shlex.quote(a)}" for a in job.run_args))
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "#!/bin/bash",
        f"# Written by parbench slurm ({when}): {job.nodes} node(s) x {job.gpus_per_node} GPU(s), one parbench",
        "# launcher per node; torchrun's c10d rendezvous at the first node of the allocation (node 0, which",
        "# writes the tables). The results folder must be on storage every node sees.",
        *(f"#SBATCH {x}" for x in job.sbatch_lines()),
        "set -euo pipefail",
        f"mkdir -p {shlex.quote(job.out)}",
        # no pipe into head: under pipefail, scontrol killed by SIGPIPE once head has its line would
        # end the job with no message
        'hosts=$(scontrol show hostnames "$SLURM_JOB_NODELIST")',
        'head_node=${hosts%%$\'\\n\'*}',
        ': "${head_node:?scontrol show hostnames gave no host names for $SLURM_JOB_NODELIST}"',
        f'export PARBENCH_RDZV_ENDPOINT="${{head_node}}:{job.port}"',
        'echo "parbench: $SLURM_JOB_NUM_NODES node(s), rendezvous at $PARBENCH_RDZV_ENDPOINT"',
        f"srun --nodes={job.nodes} --ntasks-per-node=1 --kill-on-bad-exit=1"
        + (f" --cpus-per-task={job.cpus_per_task}" if job.cpus_per_task else "")
        + f" bash -c {shlex.quote(inner)}",
        "",
    ]
    return "\n".join(lines)


#: sbatch's answer: "Submitted batch job 4242", or with --parsable "4242" / "4242;cluster"
JOB_ID = re.compile(r"Submitted batch job (\d+)|^(\d+)(?:;\S+)?$", re.M)


def submit(script: Path, *, timeout_s: float) -> tuple[str | None, str]:
    """Submit ``script`` with the sbatch on PATH, waiting at most ``timeout_s`` (its whole process
    tree is killed past that): (job id, or None when sbatch printed none; what sbatch printed).
    A missing, failing or silent sbatch is a one-line UserError that says where the script is."""
    sbatch = shutil.which("sbatch")
    again = f"the script is kept at {script}"
    if sbatch is None:
        raise UserError(f"sbatch not found on PATH; {again}: submit it on a Slurm login node with sbatch {script}")
    try:
        r = run_tree([sbatch, str(script)], env=dict(os.environ), timeout_s=timeout_s)
    except subprocess.TimeoutExpired:
        raise UserError(f"sbatch did not answer within {timeout_s:g} s (is the Slurm controller reachable?); "
                        f"{again}: check squeue --me before you submit it again with sbatch {script}") from None
    except OSError as e:
        raise UserError(f"sbatch at {sbatch} cannot be run ({e.strerror}); {again}: submit it with sbatch "
                        f"{script} where sbatch works") from None
    said = [ln.strip() for ln in f"{r.stderr}\n{r.stdout}".splitlines() if ln.strip()]
    if r.returncode:
        why = next((ln for ln in reversed(said) if "error" in ln.lower()), said[-1] if said else "no message")
        raise UserError(f"sbatch {script} failed (exit code {r.returncode}): {why}; {again}: fix what sbatch "
                        f"names and submit it with sbatch {script}")
    m = JOB_ID.search(r.stdout)
    return (m.group(1) or m.group(2) if m else None), " ".join(said)
