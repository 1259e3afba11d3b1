"""Start several `parbench run` launchers as the nodes of one run (on this machine, or each inside a
network namespace), wait for them, and check that none of their processes is left."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from bench.runtime.process import free_port

__all__ = ["free_port", "kill_tree", "leftovers", "run_dir", "start", "wait_all"]

ROOT = Path(__file__).parents[2]


@dataclass
class Node:
    rc: int | None
    out: str
    err: str
    proc: subprocess.Popen


def start(args: list[str], *, node_rank: int, nnodes: int, endpoint: str, out: Path, prefix: list[str] | None = None,
          env: dict[str, str] | None = None) -> subprocess.Popen:
    """One node's launcher, in a process of its own (stdout/stderr captured)."""
    argv = [*(prefix or []), sys.executable, "-m", "bench", "run", *args, "--nnodes", str(nnodes),
            "--node-rank", str(node_rank), "--rdzv-endpoint", endpoint, "--out", str(out), "--no-progress"]
    full = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=full, cwd=ROOT)


def wait_all(procs: list[subprocess.Popen], timeout_s: float) -> list[Node]:
    """Wait for every launcher (killing all of them past ``timeout_s``: a hang fails the test, it
    does not stall the suite)."""
    end = time.monotonic() + timeout_s
    out = []
    for p in procs:
        try:
            o, e = p.communicate(timeout=max(end - time.monotonic(), 1))
        except subprocess.TimeoutExpired:
            for q in procs:
                kill_tree(q.pid)
            o, e = p.communicate()
            e += f"\n[test] killed after {timeout_s:g}s"
        out.append(Node(rc=p.returncode, out=o, err=e, proc=p))
    return out


def kill_tree(pid: int) -> None:
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return
    for p in procs:
        try:
            p.kill()
        except psutil.Error:
            pass


def leftovers(marker: str, grace_s: float = 10.0) -> list[str]:
    """Processes still running whose command line mentions ``marker`` (the test's folder), after
    ``grace_s`` for them to finish exiting; they are killed so that the suite goes on."""
    end = time.monotonic() + grace_s
    while True:
        found = []
        for p in psutil.process_iter(["cmdline", "pid", "status"]):
            cmd = " ".join(p.info.get("cmdline") or [])
            if marker in cmd and p.pid != os.getpid() and p.info.get("status") != psutil.STATUS_ZOMBIE:
                found.append(p)
        if not found or time.monotonic() > end:
            break
        time.sleep(0.5)
    for p in found:
        try:
            p.kill()
        except psutil.Error:
            pass
    return [f"pid {p.pid}: {' '.join((p.info.get('cmdline') or [])[-3:])}" for p in found]


def run_dir(out: Path) -> Path:
    dirs = [d for d in out.iterdir() if d.is_dir() and (d / "meta.json").exists()]
    assert len(dirs) == 1, dirs
    return dirs[0]
