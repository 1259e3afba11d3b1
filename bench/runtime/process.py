"""Rank processes of one torchrun launch: their command, their environment, and their whole tree.

One process tree per run, which dies with it: the caller becomes the Linux child subreaper of its
descendants (:func:`become_subreaper`: a rank whose agent dies is re-parented to it, not to init);
each launch's ranks are captured while alive and found again by their plan file
(:class:`ProcessTree`), so a timeout, a signal or an exception kills all of them, and a process
still alive after its launch ended is killed and named. :class:`Launch` is one launch of a worker
module for a plan file: started, followed, stopped, and its crash explained.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil

from bench.core.rankenv import RANK_ENV_DEFAULTS
from bench.measure.hardware import threads_per_rank
from bench.runtime.crash import crash_reason
from bench.runtime.events import EventReader

#: The launching process's pid, for the watchdog in every rank (the worker exits when it is gone).
LAUNCHER_ENV = "PARBENCH_LAUNCHER_PID"
PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_env(nproc: int, node_rank: int = 0, share: int = 1) -> dict[str, str]:
    """The ranks' environment; ``share``: nodes of the run on this machine (their ranks split its
    cores)."""
    env = dict(os.environ)
    env["PARBENCH_NODE_RANK"] = str(node_rank)  # the worker's leader is the first rank of node 0
    # Workers import exactly what this process imports (the checkout, a user's workload module).
    env["PYTHONPATH"] = os.pathsep.join([p for p in sys.path if p] + [env.get("PYTHONPATH", "")])
    env.setdefault("OMP_NUM_THREADS", str(threads_per_rank(nproc * share)))
    for k, v in RANK_ENV_DEFAULTS.items():
        env.setdefault(k, v)
    env[LAUNCHER_ENV] = str(os.getpid())
    return env


def torchrun_cmd(plan_path: str, nproc: int, *, module: str, nnodes: int = 1, endpoint: str | None = None,
                 rdzv_id: str = "", rdzv_timeout_s: float = 300.0, local_addr: str | None = None) -> list[str]:
    """The torchrun command of one launch of the worker ``module`` (``python -m MODULE PLAN``): on
    one node a private loopback rendezvous; on several, torchrun's c10d rendezvous at ``endpoint``,
    whose store node 0's launcher hosts (is_host=0: no agent hosts it, so the store outlives each
    launch and agents of any node may start first)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={nnodes}", f"--nproc-per-node={nproc}"]
    if nnodes == 1:
        cmd += ["--master-addr=127.0.0.1", f"--master-port={free_port()}"]
    else:
        cmd += ["--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}", f"--rdzv-id={rdzv_id}",
                f"--rdzv-conf=is_host=0,join_timeout={max(int(rdzv_timeout_s), 1)}"]
        if local_addr:  # what the other nodes reach this one at (the host name may resolve to loopback)
            cmd.append(f"--local-addr={local_addr}")
    return cmd + ["--max-restarts=0", "-m", module, plan_path]


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
    plus any process whose command line names this launch's plan file (an orphaned rank). A rank
    running the worker ``module`` is named by it; any other process by its name."""

    def __init__(self, proc: subprocess.Popen, plan_path: str, module: str | None = None):
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
        for p in psutil.process_iter(["cmdline"]):
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
            try:
                os.killpg(self.proc.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
            members = self.members()
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
        for p in left:
            try:
                p.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(left, timeout=2.0)
        return names


class Launch:
    """One torchrun of the worker ``module`` for the plan file ``PREFIX.json``, started at once.

    Its output goes to ``PREFIX.log``; the ranks write their events to ``PREFIX-r<rank>.jsonl``
    (read through :attr:`events`) and their last error to ``PREFIX-r<rank>.err``. torchrun runs in
    a session of its own, so stopping it takes its ranks down with it; ``rendezvous`` goes to
    :func:`torchrun_cmd` (``nnodes``, ``endpoint``, ``rdzv_id``, ``rdzv_timeout_s``, ``local_addr``)."""

    def __init__(self, prefix: str, nproc: int, *, module: str, env: dict[str, str], **rendezvous: Any):
        self.prefix = prefix
        self.plan_path = prefix + ".json"
        self.logpath = Path(prefix + ".log")
        cmd = torchrun_cmd(self.plan_path, nproc, module=module, **rendezvous)
        with open(self.logpath, "w") as logf:
            self.proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, env=env, start_new_session=True)
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
