"""bench.runtime's ways to run children other than a plan's torchrun launch: a command with its
whole tree (run_tree), ranks without torchrun (run_ranks), a spawned group (Spawned)."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil
import pytest

from bench.runtime.process import child_env, run_ranks, run_tree, torchrun_cmd
from bench.runtime.spawned import Spawned

#: a child that starts a grandchild which sleeps, prints the grandchild's pid and sleeps too
PARENT = ("import subprocess, sys, time; "
          "g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); "
          "print(g.pid, flush=True); time.sleep(600)")


def test_torchrun_cmd_takes_a_modules_own_flags():
    cmd = torchrun_cmd(["--steps", "3"], 2, module="tools.baselines.plain_ddp")
    assert cmd[-4:] == ["-m", "tools.baselines.plain_ddp", "--steps", "3"]
    assert torchrun_cmd("p.json", 2, module="m")[-3:] == ["-m", "m", "p.json"]


def test_child_env_path_threads_and_defaults(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setenv("NVSHMEM_DISABLE_NVLS", "0")
    env = child_env(2, path=["/somewhere"], threads=False, defaults={"NVSHMEM_DISABLE_NVLS": "1", "X_NEW": "1"})
    assert env["PYTHONPATH"].split(":")[0] == "/somewhere"
    assert "OMP_NUM_THREADS" not in env
    assert env["NVSHMEM_DISABLE_NVLS"] == "0" and env["X_NEW"] == "1"  # the user's own value wins


def test_run_tree_kills_the_whole_tree_on_timeout(tmp_path):
    out = tmp_path / "out.txt"
    with open(out, "w") as f:
        with pytest.raises(subprocess.TimeoutExpired):
            run_tree([sys.executable, "-c", PARENT], env=child_env(1), timeout_s=3, stdout=f)
    grandchild = int(out.read_text().split()[0])
    gone = not psutil.pid_exists(grandchild) or psutil.Process(grandchild).status() == psutil.STATUS_ZOMBIE
    assert gone, "the grandchild outlived its command's timeout"


def _ranks_of(tmp_path, code: str, timeout_s: float = 60) -> tuple[int, str, str]:
    """run_ranks of 2 ranks of a module that executes ``code`` (``python -m`` needs a module)."""
    (tmp_path / "rank_prog.py").write_text(code + "\n")
    return run_ranks("rank_prog", [], 2, env=child_env(2, path=[str(tmp_path)]), timeout_s=timeout_s, cwd=tmp_path)


def test_run_ranks_sets_rank_variables_and_a_failed_rank_stops_the_rest(tmp_path):
    code = ("import os, sys, time; r = int(os.environ['RANK']); print(r, os.environ['WORLD_SIZE'], flush=True); "
            "sys.exit(3) if r == 0 else time.sleep(600)")
    t = time.monotonic()
    rc, out, _ = _ranks_of(tmp_path, code)
    assert rc == 3 and out.split() == ["0", "2"]
    assert time.monotonic() - t < 30  # rank 1 did not sleep its 600 s


def test_run_ranks_times_out_with_124(tmp_path):
    t = time.monotonic()
    rc, _, _ = _ranks_of(tmp_path, "import time; time.sleep(600)", timeout_s=2)
    assert rc == 124 and time.monotonic() - t < 30


def test_spawned_stop_ends_a_process_that_does_not_quit():
    group = Spawned()
    q = group.queue()
    p = group.start(time.sleep, (600,), "sleeper")
    assert group.dead() == []
    assert group.stop(grace_s=0.5) == ["sleeper"]
    assert not p.is_alive() and group.dead() == ["sleeper"]
    q.put("left in the queue")  # a released queue no longer holds this process at exit


def test_queues_leaked_by_a_killed_process_are_cleaned_without_words_on_stderr():
    """A process ended between making a queue and releasing it (a stop signal at start-up): the
    resource tracker unlinks its semaphores, and says nothing after the run's one-line answer."""
    import os
    import textwrap
    from pathlib import Path

    code = textwrap.dedent("""
        import multiprocessing as mp, os, sys
        from bench.runtime.spawned import quiet_resource_tracker
        if sys.argv[1] == "quiet":
            quiet_resource_tracker()
        q = mp.get_context("spawn").Queue()  # held: os._exit skips its release
        os._exit(0)
    """)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    got = {mode: subprocess.run([sys.executable, "-c", code, mode], capture_output=True, text=True, timeout=60,
                                env=env, cwd=Path(__file__).parents[2]).stderr for mode in ("loud", "quiet")}
    assert "leaked semaphore objects" in got["loud"]  # what the tracker says unless told not to
    assert got["quiet"] == ""
