"""Rank processes of one torchrun launch: their command, their environment, and their whole tree.

One process tree per run, which dies with it: the caller becomes the Linux child subreaper of its
descendants (:func:`become_subreaper`: a rank whose agent dies is re-parented to it, not to init);
each launch's ranks are captured while alive and found again by their plan file
(:class:`ProcessTree`), so a timeout, a signal or an exception kills all of them, and a process
still alive after its launch ended is killed and named; a child dies with the process that started
it, even one killed by SIGKILL (:mod:`bench.runtime.lifeline`). :class:`Launch` is one launch of a worker
module for a plan file: started, followed, stopped, and its crash explained; :func:`run_tree` runs
any other command (a CLI, a torchrun of a module with its own flags) to its end or its timeout, and
its whole tree with it; :func:`run_ranks` runs a module's ranks without torchrun.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psutil

from bench.core.rankenv import RANK_ENV_DEFAULTS
from bench.measure.hardware import threads_per_rank
from bench.runtime.crash import crash_reason
from bench.runtime.events import EventReader
from bench.runtime.lifeline import LAUNCHER_ENV, parent_death

PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h
#: The module a rank of a :class:`Launch` starts in: it arms the rank's death with its agent, then
#: runs the worker module (:mod:`bench.runtime.lifeline`).
LIFELINE = "bench.runtime.lifeline"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_env(nproc: int, node_rank: int = 0, share: int = 1, *, path: Sequence[str] = (),
              threads: bool = True, widest: int = 0, defaults: dict[str, str] | None = None) -> dict[str, str]:
    """The ranks' environment; ``share``: nodes of the run on this machine (their ranks split its
    cores). ``path``: import roots ahead of this process's own; ``threads``: False leaves
    OMP_NUM_THREADS to the child (a launcher that sets its own ranks' share); ``widest``: the cores
    are split as if that many ranks ran (the run's largest launch), so that a rank gets the same
    threads at every world size; ``defaults``: more variables set unless the user's environment sets
    them."""
    env = dict(os.environ)
    env["PARBENCH_NODE_RANK"] = str(node_rank)  # the worker's leader is the first rank of node 0
    # Workers import exactly what this process imports (the checkout, a user's workload module).
    env["PYTHONPATH"] = os.pathsep.join([*path, *(p for p in sys.path if p), env.get("PYTHONPATH", "")])
    if threads:
        env.setdefault("OMP_NUM_THREADS", str(threads_per_rank(max(nproc, widest) * share)))
    for k, v in {**RANK_ENV_DEFAULTS, **(defaults or {})}.items():
        env.setdefault(k, v)
    env[LAUNCHER_ENV] = str(os.getpid())
    return env


def torchrun_cmd(argv: str | Sequence[str], nproc: int, *, module: str, nnodes: int = 1, endpoint: str | None = None,
                 rdzv_id: str = "", rdzv_timeout_s: float = 300.0, local_addr: str | None = None) -> list[str]:
    """The torchrun command of one launch of the worker ``module`` (``python -m MODULE ARGV``;
    ``argv`` a plan file's path or the module's flags): on one node a private loopback rendezvous;
    on several, torchrun's c10d rendezvous at ``endpoint``, whose store node 0's launcher hosts
    (is_host=0: no agent hosts it, so the store outlives each launch and agents of any node may
    start first)."""
    cmd = [sys.executable, "-m", "bench.multinode.torchrun", f"--nnodes={nnodes}", f"--nproc-per-node={nproc}"]
    if nnodes == 1:
        cmd += ["--master-addr=127.0.0.1", f"--master-port={free_port()}"]
    else:
        cmd += ["--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}", f"--rdzv-id={rdzv_id}",
                f"--rdzv-conf=is_host=0,join_timeout={max(int(rdzv_timeout_s), 1)}"]
        if local_addr:  # what the other nodes reach this one at (the host name may resolve to loopback)
            cmd.append(f"--local-addr={local_addr}")
    return cmd + ["--max-restarts=0", "-m", module, *([argv] if isinstance(argv, str) else argv)]


def become_subreaper() -> bool:
    """Make this process the Linux child subreaper of its descendants: a rank whose torchrun agent
    dies is re-parented to the launcher (not to init), so the launcher can still find, kill and reap
    it. False where prctl is not available (other systems): the tree walk of :class:`ProcessTree`
    still applies."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _describe(p: psutil.Process, cmds: dict[int, str] | None = None) -> str:
    """'pid N (bench.train.worker)': the name :class:`ProcessTree` saw while it was alive, else the
    end of its command line."""
    cmd = (cmds or {}).get(p.pid)
    if cmd is None:
        try:
            cmd = " ".join(p.cmdline()[-3:])
        except psutil.Error:
            cmd = "?"
    return f"pid {p.pid} ({cmd})"


def _reap(p: psutil.Process) -> None:
    """Collect an adopted child that has exited (it would stay a zombie under a subreaper)."""
    try:
        os.waitpid(p.pid, os.WNOHANG)
    except (ChildProcessError, OSError):
        pass


class ProcessTree:
    """Every process of one torchrun launch: the agent, and its ranks captured while they are
    alive (ranks run in sessions of their own, so the agent's process group does not reach them),
    plus any process whose command line names this launch's plan file (an orphaned rank; without a
    plan file, only the captured ones). A rank running the worker ``module`` is named by it; any
    other process by its name. ``proc`` leads a session of its own (``start_new_session``)."""

    def __init__(self, proc: subprocess.Popen, plan_path: str | None = None, module: str | None = None):
        self.proc, self.plan_path, self.module = proc, plan_path, module
        self.known: dict[int, psutil.Process] = {}
        self.cmds: dict[int, str] = {}
        self._last = 0.0

    def refresh(self, every_s: float = 0.5) -> None:
        """Capture the agent's descendants (at most every ``every_s``: a /proc walk)."""
        if time.monotonic() - self._last < every_s:
            return
        self._last = time.monotonic()
        try:
            for c in psutil.Process(self.proc.pid).children(recursive=True):
                if c.pid not in self.known:
                    self.known[c.pid] = c
                    try:
                        self.cmds[c.pid] = self.module if self.module and self.module in c.cmdline() else c.name()
                    except psutil.Error:
                        pass
        except psutil.Error:
            pass

    def members(self) -> list[psutil.Process]:
        """The launch's processes other than the agent that are still running (zombies reaped)."""
        found = dict(self.known)
        for p in psutil.process_iter(["cmdline"]) if self.plan_path else ():
            cmd = p.info.get("cmdline") or []
            if p.pid != os.getpid() and any(self.plan_path in a for a in cmd):
                found.setdefault(p.pid, p)
        alive = []
        for pid, p in found.items():
            if pid == self.proc.pid:
                continue
            try:
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    alive.append(p)
                else:
                    _reap(p)
            except psutil.Error:
                continue
        return alive

    def kill(self, grace_s: float = 3.0) -> list[str]:
        """SIGTERM to the agent's group and every member, SIGKILL to what is left after
        ``grace_s``; returns the processes that had to be SIGKILLed."""
        self.refresh(0)
        for sig in (signal.SIGTERM, signal.SIGKILL):
            # found first: the agent's death takes its ranks with it (bench.runtime.lifeline), and a
            # rank that outlived SIGTERM is named even when that, not this SIGKILL, ends it
            members = self.members()
            try:
                os.killpg(self.proc.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
            for p in members:
                try:
                    p.send_signal(sig)
                except psutil.Error:
                    pass
            try:
                self.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                pass
            _, left = psutil.wait_procs(members, timeout=grace_s if sig == signal.SIGTERM else 1.0)
            if self.proc.poll() is not None and not left:
                return [] if sig == signal.SIGTERM else [_describe(p, self.cmds) for p in members]
        return [_describe(p, self.cmds) for p in self.members()]

    def survivors(self, grace_s: float) -> list[str]:
        """After the agent exited: members still running ``grace_s`` later are killed and named."""
        left = self.members()
        if not left:
            return []
        _, left = psutil.wait_procs(left, timeout=grace_s)
        names = [_describe(p, self.cmds) for p in left]
        kill_all(left)
        return names


def kill_all(procs: list[psutil.Process]) -> None:
    """SIGKILL the processes still running, and wait for them briefly."""
    for c in procs:
        try:
            c.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(procs, timeout=2.0)


class Launch:
    """One torchrun of the worker ``module`` for the plan file ``PREFIX.json``, started at once.

    Its output goes to ``PREFIX.log``; the ranks write their events to ``PREFIX-r<rank>.jsonl``
    (read through :attr:`events`) and their last error to ``PREFIX-r<rank>.err``. torchrun runs in
    a session of its own, so stopping it takes its ranks down with it; ``rendezvous`` goes to
    :func:`torchrun_cmd` (``nnodes``, ``endpoint``, ``rdzv_id``, ``rdzv_timeout_s``, ``local_addr``).

    No process of the launch outlives the thread that created it (which must follow it to its end):
    the agent gets SIGKILL when that thread exits, and each rank, started through
    :mod:`bench.runtime.lifeline`, gets SIGKILL when its agent does, from the rank's first
    milliseconds on."""

    def __init__(self, prefix: str, nproc: int, *, module: str, env: dict[str, str], **rendezvous: Any):
        self.prefix = prefix
        self.plan_path = prefix + ".json"
        self.logpath = Path(prefix + ".log")
        cmd = torchrun_cmd([module, self.plan_path], nproc, module=LIFELINE, **rendezvous)
        with open(self.logpath, "w") as logf:
            self.proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, env=env, start_new_session=True,
                                         preexec_fn=parent_death())
        self.tree = ProcessTree(self.proc, self.plan_path, module)
        self.events = EventReader(prefix)

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode

    def exited(self) -> bool:
        """Whether torchrun has exited (its ranks are captured first, while they are alive)."""
        self.tree.refresh()
        return self.proc.poll() is not None

    def wait(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for torchrun to exit; whether it did."""
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return False
        return True

    def kill(self, grace_s: float = 3.0) -> list[str]:
        """Stop the whole launch (:meth:`ProcessTree.kill`); the processes that needed SIGKILL."""
        return self.tree.kill(grace_s)

    def survivors(self) -> list[str]:
        """After torchrun exited: its processes still running are killed and named (a launch that
        failed gets longer to let its ranks go)."""
        return self.tree.survivors(grace_s=2.0 if self.proc.returncode else 0.5)

    def crash_reason(self, n_procs: int = 0) -> str:
        """Why the launch died (:func:`bench.runtime.crash.crash_reason`)."""
        return crash_reason(self.prefix, self.logpath, self.proc.returncode, n_procs)


def run_tree(cmd: Sequence[str], *, env: dict[str, str], timeout_s: float | None, cwd: str | Path | None = None,
             grace_s: float = 3.0, stdout: Any = subprocess.PIPE, stderr: Any = subprocess.PIPE,
             ) -> subprocess.CompletedProcess:
    """Run ``cmd`` to its end, its output captured as text (``stdout``, ``stderr``: where else it
    goes), like :func:`subprocess.run`; it runs in a session of its own, and a timeout
    (:class:`subprocess.TimeoutExpired`, raised as ``subprocess.run`` raises it), a signal or an
    exception kills its whole tree (:class:`ProcessTree`), not only the process started here; if this
    process dies, the command gets SIGKILL (:func:`bench.runtime.lifeline.parent_death`)."""
    proc = subprocess.Popen(list(cmd), cwd=cwd, env=env, stdout=stdout, stderr=stderr, text=True,
                            start_new_session=True, preexec_fn=parent_death())
    tree = ProcessTree(proc)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except BaseException:
        tree.kill(grace_s)
        proc.communicate()
        raise
    tree.survivors(grace_s=0.5)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def run_ranks(module: str, argv: Sequence[str], nproc: int, *, env: dict[str, str], timeout_s: float,
              cwd: str | Path | None = None) -> tuple[int, str, str]:
    """Run ``nproc`` ranks of ``python -m MODULE ARGV`` on this machine without torchrun, each with
    the variables torchrun would set (RANK, WORLD_SIZE, MASTER_ADDR/PORT, ...) on top of ``env``,
    in a session of its own. Returns (return code, rank 0's stdout, every rank's stderr); the code
    is 124 when they ran past ``timeout_s``. A rank that fails stops the others (they would wait for
    it until their own timeout); a timeout, a signal or an exception kills every rank's tree, and the
    ranks die with this process."""
    port = free_port()
    procs: list[subprocess.Popen] = []
    try:
        for r in range(nproc):
            renv = {**env, "RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": str(nproc),
                    "LOCAL_WORLD_SIZE": str(nproc), "GROUP_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                    "MASTER_PORT": str(port)}
            procs.append(subprocess.Popen([sys.executable, "-m", module, *argv], cwd=cwd, env=renv,
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                          start_new_session=True, preexec_fn=parent_death()))
        return _collect(procs, timeout_s)
    finally:
        _stop_all(procs)


def _collect(procs: list[subprocess.Popen], timeout_s: float) -> tuple[int, str, str]:
    """Wait for :func:`run_ranks`' ranks: (return code, rank 0's stdout, every rank's stderr)."""
    deadline = time.monotonic() + timeout_s
    outs: list[tuple[str, str]] = []
    rc = 0
    for pr in procs:
        try:
            o, e = pr.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _stop_all(procs)
            o, e = pr.communicate()
            rc = rc or 124
        outs.append((o, e))
        rc = rc or pr.returncode
        if pr.returncode:
            _stop_all(procs)
    return rc, outs[0][0], "\n".join(e for _, e in outs)


def _stop_all(procs: list[subprocess.Popen]) -> None:
    """Kill those of ``procs`` still running, each with its whole tree (:class:`ProcessTree`)."""
    for q in procs:
        if q.poll() is None:
            ProcessTree(q).kill(grace_s=1.0)
