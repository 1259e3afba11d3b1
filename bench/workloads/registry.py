"""The built-in workloads by name, a Hugging Face ``hf:<model_type>`` and a user's ``package.module:factory``,
resolved to a Workload."""

from __future__ import annotations

import contextlib
import dataclasses
import faulthandler
import importlib
import inspect
import logging
import os
import select
import signal
import threading
import time
from collections.abc import Callable

import psutil

from bench.core.errors import UserError
from bench.core.spec import WorkloadFacts
from bench.workloads import convnet, gpt, hf, mlp
from bench.workloads.base import Workload, batch_problem, display_name

log = logging.getLogger("parbench")


def _registry() -> dict[str, Callable[..., Workload]]:
    reg: dict[str, Callable[..., Workload]] = {"mlp": mlp.make, "convnet": convnet.make}
    for size in gpt.SIZES:
        reg[size] = (lambda s: lambda **kw: gpt.make(size=s, **kw))(size)
    return reg


def names() -> list[str]:
    """Names of the built-in workloads."""
    return list(_registry())


def resolve(spec: str, *, seed: int = 0, global_batch: int | None = None, **dims: int) -> Workload:
    """Turn a workload spec into a :class:`Workload`.

    ``spec`` is a built-in name (``mlp``, ``gpt-tiny`` .. ``gpt-200m``, ``convnet``),
    ``hf:<model_type>`` (a transformers causal LM from its config, :mod:`bench.workloads.hf`) or
    ``package.module:factory``; ``dims`` override dimensions (e.g. ``d_model=512`` for GPT, config
    keys such as ``hidden_size=512`` for ``hf:``).
    """
    reg = _registry()
    kw = dict(seed=seed, **dims)
    if global_batch is not None:
        kw["global_batch"] = global_batch
    if spec.startswith(hf.PREFIX):  # before the user path: it holds a ':' too
        return hf.make(spec[len(hf.PREFIX):], **kw)
    if spec in reg:
        # every dimension of a built-in workload is a size or a count (mlp[width=0] or
        # gpt-tiny[n_layer=0] would train an empty or a layerless model and report ok)
        small = [(k, v) for k, v in dims.items() if isinstance(v, int) and v < 1]
        if small:
            k, v = small[0]
            raise UserError(f"workload {spec!r}: {k}={v} must be >= 1 (a size or a count); drop it for the "
                            "workload's default")
        try:
            wl = reg[spec](**kw)
        except TypeError as e:
            raise UserError(f"workload {spec!r}: {e}; see `parbench list` for its dimensions") from None
        return _named(wl, spec, dims)
    if ":" not in spec:
        raise UserError(
            f"unknown workload {spec!r}: use one of {', '.join(reg)} or 'package.module:factory'"
        )
    return _resolve_user(spec, kw, dims, lambda _what: None)


def _resolve_user(spec: str, kw: dict, dims: dict[str, int], doing: Callable[[str], None]) -> Workload:
    """A user's ``package.module:factory``; ``doing`` hears what it is about to do (for the error
    of a factory that never returns, :func:`planned`)."""
    mod_name, _, attr = spec.partition(":")
    doing(f"the import of {mod_name!r}")
    try:
        mod = importlib.import_module(mod_name)
    except Exception as e:  # noqa: BLE001 - any import failure is the user's to fix
        raise UserError(f"workload {spec!r}: cannot import {mod_name!r} ({type(e).__name__}: {e}); "
                        "check the module is on PYTHONPATH") from None
    factory = getattr(mod, attr, None)
    if not callable(factory):
        raise UserError(f"workload {spec!r}: {mod_name} has no callable {attr!r}")
    accepted = inspect.signature(factory).parameters
    takes_any = any(p.kind is p.VAR_KEYWORD for p in accepted.values())
    unknown = [k for k in dims if not (takes_any or k in accepted)]
    if unknown:
        raise UserError(f"workload {spec!r} takes no dimension {unknown[0]!r}; its factory accepts "
                        f"{', '.join(k for k in accepted if k != 'seed') or 'none'}")
    doing(f"its factory {attr}()")
    try:
        wl = factory(**{k: v for k, v in kw.items() if takes_any or k in accepted})
    except Exception as e:  # noqa: BLE001 - a user's factory failing is the user's to fix
        raise UserError(f"workload {spec!r}: its factory raised {type(e).__name__}: {' '.join(str(e).split())}"
                        [:300]) from None
    if not isinstance(wl, Workload):
        raise UserError(f"workload {spec!r}: factory returned {type(wl).__name__}, "
                        "expected bench.workloads.Workload")
    gb = wl.global_batch
    if isinstance(gb, bool) or not isinstance(gb, int) or gb < 1:  # a batch of 0 would run "ok" with a NaN efficiency
        raise UserError(f"workload {spec!r}: its factory built global_batch={gb!r}; it must be an integer >= 1 "
                        "(the factory should take global_batch and use it)")
    return _named(wl, spec.rpartition(".")[2].replace(":", "."), dims)


def planned(spec: str, dims: dict[str, int], *, seed: int, global_batch: int | None,
            timeout_s: float) -> tuple[Workload, WorkloadFacts]:
    """The workload ``spec`` and what the planner records of it (:meth:`Workload.facts`). A user's
    workload runs its code here (its import, its factory, its model built on the meta device):
    first in a forked copy (:func:`_ends_the_process`), then in a thread given ``timeout_s``. A
    factory that never returns, or ends the process, is a one-line UserError naming it and what it
    was doing, not a run that waits or exits in silence. (The thread cannot be stopped; it is a
    daemon, so it does not keep the command from exiting.)"""
    if spec in _registry() or spec.startswith(hf.PREFIX):  # no user code runs: no thread, no timeout
        # --global-batch stands for a global_batch among the dimensions
        batch = global_batch if global_batch is not None else dims.get("global_batch")
        wl = resolve(spec, seed=seed, global_batch=batch, **{k: v for k, v in dims.items() if k != "global_batch"})
        return wl, with_sample_bytes(wl.facts(spec, dims), wl.batch(0))
    kw: dict = dict(seed=seed, **dims)
    if global_batch is not None:
        kw["global_batch"] = global_batch
    if ":" not in spec:
        resolve(spec)  # the error that names the built-in workloads
    _ends_the_process(spec, kw, dims, timeout_s)
    doing = ["its factory"]
    got: dict[str, object] = {}

    def work() -> None:
        try:
            wl = _resolve_user(spec, kw, dims, lambda what: doing.__setitem__(0, what))
            doing[0] = "building its model on the meta device"
            facts = wl.facts(spec, dims)
            doing[0] = "its batch(0)"
            try:
                first = wl.batch(0)
            except Exception as e:  # noqa: BLE001 - the user's loader: named, in one line
                said = " ".join(str(e).split())[:300]
                raise UserError(f"workload {spec!r}: its batch(0) raised {type(e).__name__}: {said}") from None
            problem = batch_problem(wl, first, 0)
            if problem:
                raise UserError(f"workload {spec!r}: {problem}")
            got["facts"] = (wl, with_sample_bytes(facts, first))
        except SystemExit as e:  # the user's code asked the whole command to exit: it may not
            got["error"] = UserError(f"workload {spec!r}: {doing[0]} called sys.exit({e.code!r}); a factory "
                                     "returns a Workload (raise an exception to say what is wrong)")
        except BaseException as e:  # noqa: BLE001 - raised again in the caller's thread
            got["error"] = e

    here = os.getcwd()
    before = {c.pid for c in psutil.Process().children()}
    t = threading.Thread(target=work, name=f"parbench-workload {spec}", daemon=True)
    t.start()
    t.join(timeout_s)
    _end_new_children(spec, before)
    if os.getcwd() != here:  # a relative --out would land where the factory went
        log.warning("workload %r: its factory changed the working directory to %s; parbench went back to %s",
                    spec, os.getcwd(), here)
        os.chdir(here)
    if t.is_alive():
        raise _did_not_return(spec, doing[0], timeout_s)
    if "error" in got:
        raise got["error"]  # type: ignore[misc]
    return got["facts"]  # type: ignore[return-value]


def with_sample_bytes(facts: WorkloadFacts, batch) -> WorkloadFacts:
    """``facts`` with the bytes of one sample of ``batch`` (a global batch: inputs and targets)."""
    total = sum(t.numel() * t.element_size() for t in batch)
    return dataclasses.replace(facts, sample_bytes=-(-total // max(1, facts.global_batch)))


#: the last line a forked dry run writes when the user's code returned (or raised) to it
_RETURNED = "\0returned"


def _ends_the_process(spec: str, kw: dict, dims: dict[str, int], timeout_s: float) -> None:
    """A user's workload code run once in a forked copy of this process first: code that ends the
    process it runs in (``os._exit``, a crash in an extension) ends the copy, and this names it in
    one UserError, where in this process it would end ``parbench run`` without a word; code that
    does not return within ``timeout_s`` is named as the build's own timeout names it. Code that
    raises or returns is left to the build that follows, which says so in its own words. No fork
    (not POSIX): nothing is tried."""
    if not hasattr(os, "fork"):
        return
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the copy: the user's code, then out without running the parent's exit handlers
        os.setpgid(0, 0)  # a group of its own: what the user's code forks stays in it, to be ended with it
        os.close(read)
        faulthandler.disable()  # a crash of the copy is this function's to say, in one line
        quiet = os.open(os.devnull, os.O_WRONLY)
        os.dup2(quiet, 1)  # what the user's code prints, it prints once: in the build that follows
        os.dup2(quiet, 2)
        try:
            wl = _resolve_user(spec, kw, dims, lambda what: os.write(write, f"{what}\n".encode()))
            os.write(write, b"building its model on the meta device\n")
            wl.facts(spec, dims)
            os.write(write, b"its batch(0)\n")
            wl.batch(0)
        except BaseException:  # noqa: BLE001, S110 - said by the build in this process
            pass
        os.write(write, f"{_RETURNED}\n".encode())
        os._exit(0)
    with contextlib.suppress(OSError):  # both sides set it, so neither waits on the other
        os.setpgid(pid, pid)
    os.close(write)
    said, ended = _read_until(read, time.monotonic() + timeout_s)
    if not ended:  # still running at the deadline: said now, not after a second wait in this process
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        _end_group(spec, pid)
        raise _did_not_return(spec, said[-1] if said else "its factory", timeout_s)
    _, status = os.waitpid(pid, 0)
    _end_group(spec, pid)
    if said and said[-1] == _RETURNED:
        return
    code = os.waitstatus_to_exitcode(status)
    how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
    doing = said[-1] if said else "its import"
    raise UserError(f"workload {spec!r}: {doing} ended the process ({how}) while the run was planned; a factory "
                    "returns a Workload (raise an exception to say what is wrong)")


def _end_group(spec: str, pgid: int) -> None:
    """Processes the dry run's user code forked and left behind (its process group outlives it):
    killed (SIGKILL: a fork inherits parbench's signal handlers) and named."""
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return  # nothing left
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
    log.warning("workload %r: its factory left a process running (it forked, or started one, while the run was "
                "planned); it was killed: a factory returns a Workload and leaves nothing running", spec)


def _end_new_children(spec: str, before: set[int]) -> None:
    """Children of this process that the user's code started while the run was planned (a fork, a
    server it launched): killed, reaped and named, where they would outlive ``parbench run``."""
    try:
        new = [c for c in psutil.Process().children() if c.pid not in before]
    except psutil.Error:
        return
    for c in new:
        with contextlib.suppress(psutil.Error):
            c.kill()
    psutil.wait_procs(new, timeout=5)
    if new:
        log.warning("workload %r: its factory left %d process(es) running (pid %s: it forked, or started one, while "
                    "the run was planned); killed: a factory returns a Workload and leaves nothing running", spec,
                    len(new), ", ".join(str(c.pid) for c in new))


def _did_not_return(spec: str, doing: str, timeout_s: float) -> UserError:
    return UserError(f"workload {spec!r}: {doing} did not return within {timeout_s:g} s; fix it, or give it longer "
                     "with --workload-timeout SECONDS")


def _read_until(fd: int, deadline: float) -> tuple[list[str], bool]:
    """The lines written to ``fd`` until it closes, the dry run's last word arrives or ``deadline``
    (time.monotonic) passes, and whether the dry run ended."""
    buf, ended = b"", False
    try:
        while not ended:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                break
            chunk = os.read(fd, 4096)
            buf += chunk
            # closed, or the copy's last word (a process the user's code started may hold it open)
            ended = not chunk or f"{_RETURNED}\n".encode() in buf
    finally:
        os.close(fd)
    return buf.decode(errors="replace").splitlines(), ended


def _named(wl: Workload, base: str, dims: dict[str, int]) -> Workload:
    """The workload under a name that carries its dimensions (unless its factory named them)."""
    if dims and "(" not in wl.name:
        return dataclasses.replace(wl, name=display_name(wl.name or base, dims))
    return wl
