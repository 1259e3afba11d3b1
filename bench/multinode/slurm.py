"""An sbatch script for a multi-node run: srun starts one parbench launcher per node.

The script asks Slurm for ``nodes`` nodes with one task each (and ``gpus_per_node`` GPUs), takes
the first host of the allocation as the rendezvous endpoint (its launcher is node 0: Slurm numbers
the nodes of a step from the first host, and ``SLURM_NODEID`` becomes ``--node-rank``), and runs
``parbench run`` on every node with the same flags, into a results folder that must be on storage
every node sees (node 0 writes the tables there, every node its logs). ``srun --kill-on-bad-exit``
stops the other nodes when one fails, so nothing is left running on the allocation.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from datetime import datetime, timezone


@dataclass(frozen=True, kw_only=True)
class SlurmJob:
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


def render(job: SlurmJob) -> str:
    """The sbatch script's text."""
    # --exclusive: a benchmark wants whole nodes (other jobs' load would be measured as its own), and
    # some clusters give a task one CPU unless asked; srun gets --cpus-per-task itself where set.
    sb = [f"--job-name={job.job_name}", f"--nodes={job.nodes}", "--ntasks-per-node=1", "--exclusive",
          f"--output={job.out}/slurm-%j.out", f"--chdir={job.workdir}"]
    if job.gpus_per_node:
        sb.append(f"--gpus-per-node={job.gpus_per_node}")
    for key, value in (("time", job.time), ("partition", job.partition), ("account", job.account),
                       ("cpus-per-task", job.cpus_per_task)):
        if value:
            sb.append(f"--{key}={value}")
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
        *(f"#SBATCH {x}" for x in sb),
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
