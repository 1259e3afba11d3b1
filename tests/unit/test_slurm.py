"""`parbench slurm` writes an sbatch script and submits it; checked with a fake `sbatch` (runs the
script as Slurm would on a 2-node allocation), a fake `scontrol` (the allocation's host names) and
a fake `srun` (one task per node, SLURM_NODEID set) on the PATH. The tasks run a fake Python that
records its arguments, so the test sees exactly the command every node would run."""

from __future__ import annotations

import os
import shlex
import stat
import subprocess
from pathlib import Path

import pytest

from bench.cli.main import main

SBATCH = """#!/bin/bash
# Run the batch script as Slurm would on a 2-node allocation, then say what sbatch says.
export SLURM_JOB_NODELIST="node-a,node-b" SLURM_JOB_NUM_NODES=2 SLURM_JOB_ID=4242
bash "$1" > "$FAKE_LOG/batch.out" 2>&1 || { echo "batch script failed" >&2; exit 1; }
echo "Submitted batch job 4242"
"""
SCONTROL = """#!/bin/bash
[ "$1 $2" = "show hostnames" ] && printf 'node-a\\nnode-b\\n'
"""
SRUN = """#!/bin/bash
# One task per node of the allocation, in parallel, each with its SLURM_NODEID.
echo "$@" > "$FAKE_LOG/srun.args"
nodes=1
while [ $# -gt 0 ]; do
  case "$1" in --nodes=*) nodes="${1#--nodes=}"; shift ;; --*) shift ;; *) break ;; esac
done
for i in $(seq 0 $((nodes - 1))); do SLURM_NODEID=$i SLURM_NNODES=$nodes "$@" & done
wait
"""
PYTHON = """#!/bin/bash
printf '%s\\n' "$@" > "$FAKE_LOG/node-$SLURM_NODEID.args"
"""


def _exe(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_slurm_script_runs_one_launcher_per_node_with_the_first_node_as_endpoint(tmp_path, monkeypatch, capsys):
    bin_dir, log = tmp_path / "bin", tmp_path / "log"
    bin_dir.mkdir()
    log.mkdir()
    for name, text in (("sbatch", SBATCH), ("scontrol", SCONTROL), ("srun", SRUN)):
        _exe(bin_dir / name, text)
    python = _exe(tmp_path / "fake-python", PYTHON)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_LOG", str(log))
    script, out = tmp_path / "job.sbatch", tmp_path / "shared" / "results"
    code = main(["slurm", "--nodes", "2", "--gpus-per-node", "4", "--time", "00:20:00", "--script", str(script),
                 "--python", str(python), "--submit", "--workloads", "gpt-small", "--strategies", "ddp,fsdp-tp",
                 "--world-sizes", "8", "--steps", "10", "--option", "mesh=2x4", "--out", str(out)])
    printed = capsys.readouterr().out
    assert code == 0 and "submitted job 4242 (Submitted batch job 4242)" in printed, printed
    text = script.read_text()
    assert "#SBATCH --nodes=2" in text and "#SBATCH --ntasks-per-node=1" in text and "#SBATCH --exclusive" in text
    assert "#SBATCH --gpus-per-node=4" in text and "#SBATCH --time=00:20:00" in text
    assert f'#SBATCH --output="{out}/slurm-%j.out"' in text
    assert f"--output={out}/slurm-%j.out" in sbatch_options(text)
    assert "--kill-on-bad-exit=1" in (log / "srun.args").read_text()
    common = ["-m", "bench", "run", "--nnodes", "2", "--rdzv-endpoint", "node-a:29400", "--out", str(out),
              "--no-progress", "--workloads", "gpt-small", "--strategies", "ddp,fsdp-tp", "--world-sizes", "8",
              "--option", "mesh=2x4", "--steps", "10"]
    for rank in (0, 1):
        argv = (log / f"node-{rank}.args").read_text().splitlines()
        assert argv[argv.index("--node-rank") + 1] == str(rank), argv
        rest = [a for i, a in enumerate(argv) if a != "--node-rank" and (i == 0 or argv[i - 1] != "--node-rank")]
        assert rest == common, shlex.join(argv)
    assert out.is_dir()  # the batch script made the results folder


def test_slurm_without_submit_writes_the_script_and_says_how_to_submit(tmp_path, capsys):
    script = tmp_path / "one.sbatch"
    assert main(["slurm", "--nodes", "1", "--gpus-per-node", "0", "--device", "cpu", "--script", str(script)]) == 0
    assert f"sbatch {script}" in capsys.readouterr().out
    text = script.read_text()
    assert "--nnodes" not in text and "--gpus-per-node" not in text  # one node: no rendezvous flags
    assert "--device cpu" in text


def test_the_head_node_survives_a_long_host_list(tmp_path, monkeypatch, capsys):
    """`scontrol ... | head -n 1` under pipefail failed the job without a word whenever head closed the
    pipe before scontrol finished writing (SIGPIPE; a CI run hit it with 2 names, a big allocation
    would always): the script takes the first name without a pipe."""
    import subprocess

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _exe(bin_dir / "scontrol", '#!/bin/bash\nfor i in $(seq 1 200000); do echo "node-$i"; done\n')
    script = tmp_path / "job.sbatch"
    assert main(["slurm", "--nodes", "2", "--gpus-per-node", "4", "--script", str(script), "--out",
                 str(tmp_path / "out"), "--workloads", "mlp"]) == 0
    capsys.readouterr()
    lines = script.read_text().splitlines()
    head = "\n".join(lines[:next(i for i, ln in enumerate(lines) if ln.startswith("echo "))])
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "SLURM_JOB_NODELIST": "node-[1-200000]"}
    r = subprocess.run(["bash", "-c", head + '\necho "$PARBENCH_RDZV_ENDPOINT"'], env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "node-1:29400", (r.returncode, r.stdout[-200:], r.stderr[-500:])


def sbatch_options(text: str) -> list[str]:
    """The options sbatch takes from a script's #SBATCH lines, read as sbatch reads them: from the
    lines after the first up to the first line that is neither a comment nor blank; arguments split
    at whitespace, grouped by single or double quotes, a backslash escaping the next character, an
    unescaped '#' ending the line (Slurm's src/sbatch/opt.c, _get_argument)."""
    opts: list[str] = []
    for line in text.splitlines()[1:]:
        if line.startswith("#SBATCH"):
            opts += _arguments(line[len("#SBATCH"):])
        elif line.strip() and not line.startswith("#"):
            break
    return opts


def _arguments(line: str) -> list[str]:
    out, i = [], 0
    while True:
        while i < len(line) and line[i].isspace():
            i += 1
        if i >= len(line):
            return out
        arg, quote, escaped = "", "", False
        while i < len(line) and (quote or not line[i].isspace()):
            c = line[i]
            i += 1
            if escaped:
                arg, escaped = arg + c, False
            elif c == "\\":
                escaped = True
            elif quote:
                quote, arg = ("", arg) if c == quote else (quote, arg + c)
            elif c in "\"'":
                quote = c
            elif c == "#":
                return out + [arg] if arg else out
            else:
                arg += c
        out.append(arg)


def test_the_sbatch_line_reader_reads_quotes_escapes_and_comments():
    line = ' --a=1 --output="/x y/%j.out" --b=\'c d\' # --c=2'
    assert _arguments(line) == ["--a=1", "--output=/x y/%j.out", "--b=c d"]
    assert _arguments(" --a=x#y") == ["--a=x"]
    assert sbatch_options("#!/bin/bash\n#SBATCH --a=1\necho hi\n#SBATCH --b=2\n") == ["--a=1"]


#: (flag, value) a user might pass by mistake or on purpose: each is refused (one line, exit 2) or
#: written so that sbatch reads exactly the options meant and the shell runs no line of it
HOSTILE = [("--job-name", "x\ntouch {tmp}/INJECTED"), ("--job-name", "two words"), ("--job-name", "x#y"),
           ("--job-name", "x\x1b[2J"), ("--partition", "gpu\n#SBATCH --account=other"),
           ("--partition", "gpu --account=other"), ("--account", "a;touch {tmp}/INJECTED"), ("--account", "a\rb"),
           ("--time", "banana"), ("--time", "1:00\ntouch {tmp}/INJECTED"), ("--time", "1-"), ("--time", "00:30:00 x"),
           ("--out", "{tmp}/a\ntouch {tmp}/INJECTED"), ("--out", '{tmp}/a" --wrap="touch {tmp}/INJECTED'),
           ("--out", "{tmp}/a b#c"), ("--out", "{tmp}/it's"), ("--out", "{tmp}/50%j"), ("--out", "{tmp}/a\\b"),
           ("--python", "/usr/bin/python3\ntouch {tmp}/INJECTED"), ("--python", "py'; touch {tmp}/INJECTED; '"),
           ("--option", "mesh=2x2\ntouch {tmp}/INJECTED"), ("--option", "mesh=$(touch {tmp}/INJECTED)"),
           ("--workloads", "mlp\ntouch {tmp}/INJECTED")]
SBATCH_KEYS = {"--job-name", "--nodes", "--ntasks-per-node", "--exclusive", "--output", "--chdir", "--gpus-per-node",
               "--time", "--partition", "--account", "--cpus-per-task"}


@pytest.mark.parametrize("flag,value", HOSTILE, ids=[f"{f}={v!r}" for f, v in HOSTILE])
def test_hostile_values_are_refused_or_stay_inside_their_line(flag, value, tmp_path, monkeypatch, capsys):
    value = value.replace("{tmp}", str(tmp_path))
    bin_dir, log = tmp_path / "bin", tmp_path / "log"
    bin_dir.mkdir()
    log.mkdir()
    _exe(bin_dir / "scontrol", SCONTROL)
    _exe(bin_dir / "srun", SRUN)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_LOG", str(log))
    monkeypatch.chdir(tmp_path)
    script, out = tmp_path / "job.sbatch", str(tmp_path / "out")
    argv = {"--out": out, "--python": str(_exe(tmp_path / "fake-python", PYTHON)), "--workloads": "mlp",
            flag: value}
    code = main(["slurm", "--nodes", "2", "--gpus-per-node", "0", "--device", "cpu", "--script", str(script),
                 *[x for kv in argv.items() for x in kv]])
    err = capsys.readouterr().err
    if code == 2:
        named = flag in err or repr(value) in err or repr(value.split("=", 1)[-1]) in err
        assert len(err.strip().splitlines()) == 1 and named, err
        assert not script.exists()
        return
    assert code == 0, err
    text = script.read_text()
    opts = sbatch_options(text)
    keys = [o.split("=", 1)[0] for o in opts]
    assert set(keys) <= SBATCH_KEYS and len(keys) == len(set(keys)), opts
    assert {"--nodes=2", f"--output={argv['--out']}/slurm-%j.out", f"--chdir={tmp_path}"} <= set(opts), opts
    if flag in ("--job-name", "--partition", "--account", "--time"):
        assert f"{flag}={value}" in opts, opts
    r = subprocess.run(["bash", str(script)], env={**os.environ, "SLURM_JOB_NODELIST": "node-a,node-b",
                                                   "SLURM_JOB_NUM_NODES": "2"},
                       capture_output=True, text=True, timeout=60)
    assert not (tmp_path / "INJECTED").exists(), (r.stdout, r.stderr)
    if flag != "--python":  # else no such interpreter: the job fails, and runs nothing else
        assert r.returncode == 0, (r.stdout, r.stderr)
        args = (log / "node-0.args").read_text().splitlines()
        assert value in args or (flag == "--option" and value in args), args
