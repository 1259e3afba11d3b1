"""Why a launch died: which rank, how (exit code or signal), and its last error line.

The sources are torchrun's log (its "Root Cause" summary) and the error file each rank writes
(``PREFIX-r<rank>.err``, by the worker); torchrun's own boilerplate is never the reason.
"""

from __future__ import annotations

import re
import signal
from pathlib import Path

#: torchrun lines that say nothing about the error (its own boilerplate)
_BOILERPLATE = re.compile(r"To enable traceback|error_file|traceback\s*:|torch.distributed.elastic|"
                          r"^\s*(time|host|rank|exitcode|root cause|failures|\[\d+\])\s*[:(]|^[=-]{5,}|"
                          r"ChildFailedError|^\*+$|^\s*<NO_OTHER_FAILURES>", re.IGNORECASE)


def exit_text(code: int | None) -> str:
    """'exit code 3' or 'signal 9 (SIGKILL)' for a process's return code."""
    if code is None:
        return "no exit code"
    if code < 0:
        try:
            return f"signal {-code} ({signal.Signals(-code).name})"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


def root_cause(log_text: str) -> tuple[int | None, int | None]:
    """(rank, exit code) of the first failure torchrun reports in its summary ("Root Cause"; its
    "Failures" list comes first and holds the ranks it stopped afterwards), if any."""
    i = log_text.rfind("Root Cause")
    log_text = log_text[i:] if i >= 0 else log_text
    rank = re.search(r"^\s*rank\s*:\s*(\d+)", log_text, re.MULTILINE)
    code = re.search(r"^\s*exitcode\s*:\s*(-?\d+)", log_text, re.MULTILINE)
    return (int(rank[1]) if rank else None), (int(code[1]) if code else None)


#: an error line that only says a peer went away (its cause is that peer's failure)
PEER_GONE = re.compile(r"closed by peer|reset by peer|remote worker crash", re.IGNORECASE)


def failures(log_text: str) -> list[tuple[int, int | None]]:
    """(rank, exit code) of every failure in torchrun's "Failures" list (before its "Root Cause")."""
    i = log_text.rfind("Failures:")
    if i < 0:
        return []
    j = log_text.find("Root Cause", i)
    out = []
    for block in re.split(r"^\[\d+\]:\s*$", log_text[i:j if j >= 0 else None], flags=re.MULTILINE)[1:]:
        rank = re.search(r"^\s*rank\s*:\s*(\d+)", block, re.MULTILINE)
        code = re.search(r"^\s*exitcode\s*:\s*(-?\d+)", block, re.MULTILINE)
        if rank:
            out.append((int(rank[1]), int(code[1]) if code else None))
    return out


def rank_error(prefix: str, rank: int) -> str:
    """The last error line a rank wrote to its own error file (the worker writes it)."""
    try:
        lines = [ln.strip() for ln in Path(f"{prefix}-r{rank}.err").read_text(errors="replace").splitlines()]
    except OSError:
        return ""
    lines = [ln for ln in lines if ln]
    return lines[-1][:300] if lines else ""


def _log_tail(path: Path) -> str:
    """The last line of the torchrun log that looks like an error and is not torchrun's own."""
    try:
        lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    lines = [ln for ln in lines if not _BOILERPLATE.search(ln)]
    errs = [ln for ln in lines if re.search(r"(Error|Exception|error:|Killed|Aborted)", ln)]
    return (errs or lines or [""])[-1][:300]


def err_ranks(prefix: str) -> list[int]:
    """Global ranks of this launch that wrote an error file here."""
    out = []
    for p in Path(prefix).parent.glob(Path(prefix).name + "-r*.err"):
        tail = p.name[len(Path(prefix).name) + 2:-4]
        if tail.isdigit():
            out.append(int(tail))
    return sorted(out)


def crash_reason(prefix: str, logpath: Path, rc: int | None, n_procs: int = 0) -> str:
    """Which rank died, how (exit code or signal), and its last error line; the agent's own exit
    when no rank is named (the agent itself was killed)."""
    try:
        text = logpath.read_text(errors="replace")
    except OSError:
        text = ""
    rank, code = root_cause(text)
    if rank is None:
        errs = [(r, rank_error(prefix, r)) for r in err_ranks(prefix)]
        errs = [(r, e) for r, e in errs if e]
        if errs:
            r, e = errs[0]
            return f"torchrun exited with {exit_text(rc)}; rank {r}: {e}"
        tail = _log_tail(logpath)
        return f"torchrun exited with {exit_text(rc)}" + (f": {tail}" if tail else "")
    line = rank_error(prefix, rank)
    if PEER_GONE.search(line):
        # torchrun observed this rank first, but it died of a peer's going away: the peer that
        # failed in the same breath is the cause (a rank interrupted mid-collective, for one).
        others = [(r, c) for r, c in failures(text) if r != rank]
        if others:
            rank, code = others[0]
            line = rank_error(prefix, rank)
    if not line:  # a rank killed by a signal writes nothing: its peers' lines say what they saw
        others = [(r, rank_error(prefix, r)) for r in err_ranks(prefix) if r != rank]
        seen = [f"rank {r}: {e}" for r, e in others if e]
        line = f"no error line from it; {seen[0]}" if seen else "no error line from it"
    return f"rank {rank} exited with {exit_text(code)}: {line}"


def earliest(old: tuple[float, str] | None, new: tuple[float, str]) -> tuple[float, str]:
    """Of two (time, text) rank errors of one cell, the earlier (the first one on a tie): the
    earliest error is the cause, a peer's later one usually its consequence."""
    return new if old is None or new[0] < old[0] else old
