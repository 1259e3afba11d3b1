"""`parbench slurm`: values of #SBATCH lines, --submit against a missing, failing, hanging and working
sbatch (fakes on the case's PATH), and TOML configs. All in-process: the command writes a file and,
with --submit, runs sbatch."""

from __future__ import annotations

import dataclasses
import os
import stat
from pathlib import Path

import pytest

from tests.faults.harness import Case, check, params
from tests.unit.test_slurm import sbatch_options

CPU = ["--nodes", "2", "--gpus-per-node", "0", "--device", "cpu", "--workloads", "mlp", "--script", "{tmp}/job.sbatch"]
ON_PATH = {"PATH": f"{{tmp}}/bin{os.pathsep}{os.environ.get('PATH', '')}"}


def _fake_sbatch(body: str):
    """A setup that puts an executable `sbatch` running ``body`` (bash) on the case's PATH."""

    def setup(tmp: Path) -> None:
        (tmp / "bin").mkdir()
        exe = tmp / "bin" / "sbatch"
        exe.write_text(f"#!/bin/bash\n{body}\n")
        exe.chmod(exe.stat().st_mode | stat.S_IXUSR)

    return setup


def _script_kept(tmp: Path) -> list[str]:
    return [] if (tmp / "job.sbatch").is_file() else ["the script job.sbatch"]


def _submitted(tmp: Path) -> list[str]:
    """The script is there, and it is what sbatch was given."""
    given = tmp / "sbatch.args"
    lost = _script_kept(tmp)
    if not given.is_file() or given.read_text().strip() != str(tmp / "job.sbatch"):
        lost.append("the script's path as sbatch's argument")
    return lost


def _quoted_output(tmp: Path) -> list[str]:
    """sbatch reads --output as the folder given, spaces and '#' included, and nothing more."""
    opts = sbatch_options((tmp / "job.sbatch").read_text())
    want = f"--output={tmp}/a b#c/slurm-%j.out"
    return [] if want in opts and len(opts) == 6 else [f"#SBATCH options {opts} (wanted {want!r} among 6)"]


def _toml(text: str):
    def setup(tmp: Path) -> None:
        (tmp / "run.toml").write_text(text)

    return setup


def slurm(id: str, *argv: str, out: bool = True, **kw) -> Case:
    """A case of `parbench slurm` on 2 CPU nodes; ``out``: results in {tmp}/out unless argv says."""
    default_out = ["--out", "{tmp}/out"] if out and "--out" not in argv else []
    return Case(id, "slurm", ["slurm", *CPU, *default_out, *argv], **kw)


CASES = [
    slurm("time-banana", "--time", "banana", expect="--time 'banana' is not a Slurm time limit"),
    slurm("time-newline", "--time", "1:00\necho INJECTED", expect="--time '1:00\\necho INJECTED'"),
    slurm("time-no-hours", "--time", "1-", expect="D-HH"),
    slurm("job-name-newline", "--job-name", "x\necho INJECTED", expect="--job-name 'x\\necho INJECTED'"),
    slurm("job-name-space", "--job-name", "my job", expect="--job-name 'my job' must be one word"),
    slurm("partition-extra-line", "--partition", "gpu\n#SBATCH --account=other", expect="--partition 'gpu\\n"),
    slurm("account-control-char", "--account", "a\x1b[2J", expect="--account 'a\\x1b[2J'"),
    slurm("cpus-per-task-negative", "--cpus-per-task", "-2", expect="--cpus-per-task -2 must be >= 1"),
    slurm("startup-timeout-negative", "--startup-timeout=-5", expect="--startup-timeout -5: use seconds > 0"),
    slurm("workload-timeout-zero", "--workload-timeout", "0", expect="--workload-timeout 0: use seconds > 0"),
    slurm("cpus-per-task-zero", "--cpus-per-task", "0", expect="--cpus-per-task 0 must be >= 1"),
    slurm("out-newline", "--out", "{tmp}/a\necho INJECTED", expect="has '\\n', which an #SBATCH line cannot hold"),
    slurm("out-percent", "--out", "{tmp}/50%", expect="has '%'"),
    slurm("out-space-and-hash-quoted", "--out", "{tmp}/a b#c", code=0, expect="results in {tmp}/a b#c",
          kept=_quoted_output),
    slurm("python-newline", "--python", "/usr/bin/python3\necho INJECTED", expect="--python '/usr/bin/python3\\n"),
    slurm("submit-no-sbatch", "--submit", env={"PATH": "{tmp}/empty"}, kept=_script_kept,
          expect="sbatch not found on PATH; the script is kept at {tmp}/job.sbatch"),
    slurm("submit-sbatch-fails", "--submit", setup=_fake_sbatch(
        'echo "sbatch: error: Batch job submission failed: Invalid account or account/partition combination '
        'specified" >&2; exit 1'), env=ON_PATH, kept=_script_kept,
        expect="failed (exit code 1): sbatch: error: Batch job submission failed: Invalid account"),
    slurm("submit-sbatch-hangs", "--submit", "--submit-timeout", "1", setup=_fake_sbatch("sleep 60"), env=ON_PATH,
          kept=_script_kept, timeout_s=60, expect="sbatch did not answer within 1 s"),
    slurm("submit-timeout-zero", "--submit", "--submit-timeout", "0", expect="--submit-timeout 0 must be"),
    slurm("submit-ok", "--submit", setup=_fake_sbatch('echo "$1" > "$(dirname "$1")/sbatch.args"; '
                                                      'echo "Submitted batch job 4242"'),
          env=ON_PATH, code=0, kept=_submitted, expect="submitted job 4242"),
    slurm("toml-unknown-key", "--config", "{tmp}/run.toml", setup=_toml('[slurm]\ntime = "1:00"\n'),
          expect="unknown setting 'slurm'"),
    slurm("toml-wrong-type", "--config", "{tmp}/run.toml", setup=_toml('steps = "ten"\n'),
          expect="steps='ten' must be an integer"),
    slurm("toml-newline-in-strategy", "--config", "{tmp}/run.toml",
          setup=_toml('strategies = ["ddp\\necho INJECTED"]\n'), expect="'ddp\\necho INJECTED'"),
    slurm("toml-newline-in-out", "--config", "{tmp}/run.toml", setup=_toml('out = "/tmp/a\\necho INJECTED"\n'),
          out=False, expect="'/tmp/a\\necho INJECTED' has '\\n'"),
    slurm("toml-not-toml", "--config", "{tmp}/run.toml", setup=_toml("steps = \n"), expect="is not valid TOML"),
    # sizes past any machine: the mesh arithmetic of the nodes' planning spun on them without end
    slurm("nodes-huge", "--nodes", "99999999999999999999", timeout_s=60,
          expect="--nodes 99999999999999999999 x --gpus-per-node 0 is more than 65,536 devices"),
    slurm("nodes-times-gpus-huge", "--nodes", "70000", "--gpus-per-node", "8", timeout_s=60,
          expect="--nodes 70000 x --gpus-per-node 8 is more than 65,536 devices"),
    slurm("time-past-a-year", "--time", "99999999999999", expect="--time '99999999999999' is more than a year"),
    slurm("time-400-days", "--time", "400-00:00:00", expect="--time '400-00:00:00' is more than a year"),
    slurm("time-a-day", "--time", "1-00:00:00", code=0, expect="submit it with: sbatch {tmp}/job.sbatch"),
    # files that are not regular files: opening a pipe for writing blocked until a reader came
    slurm("script-is-a-pipe", "--script", "{tmp}/pipe.sbatch", setup=lambda tmp: os.mkfifo(tmp / "pipe.sbatch"),
          timeout_s=60, expect="--script '{tmp}/pipe.sbatch' is not a regular file (a pipe or a device)"),
    slurm("config-is-a-folder", "--config", "{tmp}", expect="config '{tmp}' is a folder; pass a TOML file"),
    slurm("config-is-a-pipe", "--config", "{tmp}/pipe.toml", setup=lambda tmp: os.mkfifo(tmp / "pipe.toml"),
          timeout_s=60, expect="config '{tmp}/pipe.toml' is not a regular file (a pipe or a device)"),
]


@pytest.mark.parametrize("case", params(CASES))
def test_slurm(case: Case, tmp_path: Path) -> None:
    env = {k: v.replace("{tmp}", str(tmp_path)) for k, v in case.env.items()}
    check(dataclasses.replace(case, env=env), tmp_path)
