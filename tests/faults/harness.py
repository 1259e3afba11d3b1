"""The fault suite's one judge: a case runs a `parbench` command the way a user would (in-process
where a subprocess adds nothing, a real process where signals, hangs or survivors are the point) and
gets exactly one outcome:

ok         the documented exit code, one line on stderr naming the problem (or the expected
           message), nothing running afterwards, nothing finished lost
traceback  a Python traceback reached the user (or an exception escaped ``main``)
hang       the command did not finish within the case's time
orphan     a process the command started was still running 5 s after it ended
lost       something the case says must survive (a finished row, a file) is gone or damaged
silent     a failure that said nothing, or a bad input the command accepted (exit 0)
unclear    any other difference: another exit code, several lines, the message not naming the value

Every outcome is recorded (``RECORDED``) and tests/faults/conftest.py prints the counts by command
at the end of the session, the table the fault suite is judged by.
"""

from __future__ import annotations

import contextlib
import io
import os
import signal as _signal
import subprocess
import sys
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil

OUTCOMES = ("ok", "traceback", "unclear", "silent", "orphan", "lost", "hang")
MARK = "PARBENCH_FAULT_CASE"  # set in every case's environment; children inherit it
SURVIVOR_GRACE_S = 5.0
RECORDED: list[tuple[str, str, str]] = []  # (command, case id, outcome)


@dataclass
class Case:
    """One thing a user can do wrong, or one thing that can happen to a command.

    ``argv`` and ``expect`` may hold ``{tmp}`` (the case's own folder). ``setup(tmp)`` writes what the
    case needs first; ``kept(tmp)`` returns what was lost (empty: nothing). ``signal`` is
    ``(signum, when)``: ``when`` is seconds after start, or a string the command prints first (on
    stdout or stderr); ``group`` sends it to the whole process group, as a terminal's Ctrl-C does.
    """

    id: str
    command: str
    argv: list[str]
    # what the last stderr line holds; several: any of them (outcomes that a race decides, all correct)
    expect: str | tuple[str, ...] | None = None
    code: int = 2
    setup: Callable[[Path], object] | None = None
    kept: Callable[[Path], list[str]] | None = None
    signal: tuple[int, float | str] | None = None
    group: bool = False
    subprocess: bool = False
    one_line: bool = True
    timeout_s: float = 120.0
    env: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.signal is not None:
            self.subprocess = True


@dataclass
class Result:
    code: int | None
    out: str
    err: str
    hung: bool = False
    escaped: str = ""  # an exception that escaped main() (in-process)
    survivors: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)


def _fill(s: str, tmp: Path) -> str:
    return s.replace("{tmp}", str(tmp))


def marked(mark: str) -> list[psutil.Process]:
    """Running processes (not zombies) whose environment carries ``mark``."""
    found = []
    for p in psutil.process_iter():
        if p.pid == os.getpid():
            continue
        try:
            if p.status() != psutil.STATUS_ZOMBIE and p.environ().get(MARK) == mark:
                found.append(p)
        except psutil.Error:
            continue
    return found


def _survivors(mark: str) -> list[str]:
    end = time.monotonic() + SURVIVOR_GRACE_S
    while True:
        left = marked(mark)
        if not left or time.monotonic() > end:
            break
        time.sleep(0.2)
    names = []
    for p in left:
        with contextlib.suppress(psutil.Error):
            names.append(f"{p.pid}: {' '.join(p.cmdline())[:120]}")
            p.kill()  # the suite goes on without it; the case already failed
    return names


def _in_process(argv: list[str], mark: str, env: dict[str, str]) -> Result:
    from bench.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    saved = {k: os.environ.get(k) for k in (MARK, *env)}
    os.environ.update({MARK: mark, **env})
    code, escaped = None, ""
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(argv)
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            except BaseException:  # noqa: BLE001 - what escaped is the finding
                escaped = traceback.format_exc()
                code = 1
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return Result(code=code, out=out.getvalue(), err=err.getvalue(), escaped=escaped)


def _wait_for(proc: subprocess.Popen, files: tuple[Path, Path], when: float | str, limit: float) -> None:
    end = time.monotonic() + limit
    if isinstance(when, (int, float)):
        time.sleep(when)
        return
    while time.monotonic() < end and proc.poll() is None:
        if any(when in f.read_text(errors="replace") for f in files if f.exists()):
            return
        time.sleep(0.1)


def _subprocess(case: Case, argv: list[str], tmp: Path, mark: str) -> Result:
    outf, errf = tmp / f".{case.id}.stdout", tmp / f".{case.id}.stderr"
    env = {**os.environ, MARK: mark, "PYTHONUNBUFFERED": "1", **case.env}
    with outf.open("w") as o, errf.open("w") as e:
        proc = subprocess.Popen([sys.executable, "-m", "bench", *argv], stdout=o, stderr=e, env=env,
                                start_new_session=True, cwd=tmp)
        hung = False
        try:
            if case.signal is not None:
                signum, when = case.signal
                _wait_for(proc, (outf, errf), when, case.timeout_s)
                if proc.poll() is None:
                    if case.group:
                        os.killpg(proc.pid, signum)
                    else:
                        proc.send_signal(signum)
            proc.wait(timeout=case.timeout_s)
        except subprocess.TimeoutExpired:
            hung = True
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, _signal.SIGKILL)
            proc.wait()
    return Result(code=proc.returncode, out=outf.read_text(errors="replace"), err=errf.read_text(errors="replace"),
                  hung=hung)


def run_case(case: Case, tmp: Path) -> Result:
    """Sets the case up in ``tmp``, runs it, and collects survivors and losses."""
    tmp.mkdir(parents=True, exist_ok=True)
    if case.setup is not None:
        case.setup(tmp)
    argv = [_fill(a, tmp) for a in case.argv]
    mark = uuid.uuid4().hex
    res = _subprocess(case, argv, tmp, mark) if case.subprocess else _in_process(argv, mark, case.env)
    res.survivors = _survivors(mark)
    if case.kept is not None:
        res.lost = list(case.kept(tmp))
    return res


def judge(case: Case, res: Result, tmp: Path) -> tuple[str, str]:
    """(outcome, why) for one case's result."""
    text = res.out + res.err
    if res.hung:
        return "hang", f"still running after {case.timeout_s:.0f} s"
    if res.escaped or "Traceback (most recent call last)" in text:
        return "traceback", (res.escaped or text)[-800:]
    if res.survivors:
        return "orphan", "; ".join(res.survivors)
    if res.lost:
        return "lost", "; ".join(res.lost)
    lines = [ln for ln in res.err.splitlines() if ln.strip()]
    if case.signal is not None and case.signal[0] == _signal.SIGKILL:  # nothing can be said: what is left counts
        return ("ok", "") if res.code == -_signal.SIGKILL else ("unclear", f"exit {res.code} after SIGKILL")
    if case.code != 0 and res.code == 0:
        return "silent", f"exit 0 (expected {case.code}); stderr: {res.err[-300:]!r}"
    if case.code != 0 and not lines:
        return "silent", f"exit {res.code} and nothing on stderr"
    if res.code != case.code:
        return "unclear", f"exit {res.code} (expected {case.code}); stderr: {res.err[-400:]!r}"
    if case.code != 0 and case.one_line and len(lines) != 1:
        return "unclear", f"{len(lines)} lines on stderr (expected one): {res.err[-400:]!r}"
    if case.expect is not None:
        wants = [_fill(e, tmp) for e in ((case.expect,) if isinstance(case.expect, str) else case.expect)]
        if not any(w in (lines[-1] if case.code != 0 and lines else text) for w in wants):
            return "unclear", f"expected {' or '.join(map(repr, wants))} in {(lines[-1] if lines else text)[-400:]!r}"
    return "ok", ""


def check(case: Case, tmp: Path) -> None:
    """Runs ``case``, records its outcome and fails the calling test unless it is ok."""
    res = run_case(case, tmp)
    outcome, why = judge(case, res, tmp)
    RECORDED.append((case.command, case.id, outcome))
    assert outcome == "ok", f"{case.command}/{case.id}: {outcome}: {why}"


def params(cases: list[Case]) -> list:
    """pytest parameters for ``cases``: costly (subprocess) ones carry the ``faults`` marker, which the
    README's test command leaves out and .ci/run runs."""
    import pytest

    return [pytest.param(c, id=c.id, marks=[pytest.mark.faults] if c.subprocess else []) for c in cases]


def with_base(command: str, base: dict[str, str], flags: tuple[str, ...]) -> list[str]:
    """``[command, *base, *flags]``: the flags given replace ``base``'s flags of the same name."""
    given = set(flags)
    return [command, *[x for k, v in base.items() if k not in given for x in (k, v)], *flags]


def plain_file(name: str) -> Callable[[Path], object]:
    """A setup that puts a plain file at ``{tmp}/name`` (for an output path under a file)."""
    return lambda tmp: (tmp / name).write_text("not a folder")


@contextlib.contextmanager
def mounted_tmpfs(where: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` (e.g. "2m") mounted at ``where``, unmounted afterwards; the test is skipped
    where mounting is not allowed."""
    import pytest

    where.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True,
                       text=True)
    if r.returncode:
        pytest.skip(f"cannot mount a tmpfs here ({r.stderr.strip() or r.returncode})")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def meta_status(run_dir: Path, status: str | None) -> list[str]:
    """What is wrong with ``run_dir/meta.json`` for a case that expects its status to start with
    ``status`` (None: only that it reads): empty when nothing."""
    import json

    try:
        meta = json.loads((run_dir / "meta.json").read_text())
    except (OSError, ValueError) as e:
        return [f"meta.json: {e}"]
    if status is not None and not str(meta.get("status")).startswith(status):
        return [f"meta.json status {meta.get('status')!r}, expected {status!r}"]
    return []
