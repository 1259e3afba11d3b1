"""Run the shell commands that README.md and the getting-started guide show, as a user would type them.

    python -m tools.doc_commands [--list] [FILE ...]   # default: README.md docs/guides/getting-started.md

Each line of a ```bash block is one command (a line ending in ``\\`` goes on on the next line).
The commands of a page run one after another with bash, from the repository root, in one environment
that carries over, as in a reader's shell: after ``source .nox/bench/bin/activate``, ``export`` or
``cd``, the next command sees it. Each page starts afresh, as a new reader would.

Markers say how a command runs here (on a 2-core CPU machine, in minutes):

* a trailing comment ``# ci: COMMAND`` runs COMMAND instead of the line;
* a trailing comment ``# ci: skip (REASON)`` skips the line, and says why;
* an HTML comment before a block, one directive a line, ``<!-- ci: TEXT => NEW -->``, replaces TEXT
  by NEW in each command of the next bash block that holds TEXT; ``<!-- ci: TEXT => skip (REASON) -->``
  skips those commands. A directive that matches no command of its block is an error, so markers
  cannot go stale unnoticed.

Placeholders: ``<run-id>`` is the newest run folder under results/ that the page's commands made,
``<base>`` the one made before it. Any other ``<name>`` left in a command to run is an error.

One line a command: exit code, seconds, where the docs show it, what ran. A failed command prints the
end of its output. Exit status 1 if any command failed, 2 if a marker or placeholder is wrong.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ("README.md", "docs/guides/getting-started.md")
FENCE = re.compile(r"^\s*(```+|~~~+)\s*([\w-]*)")
SHELLS = ("bash", "sh", "shell")
DIRECTIVE = re.compile(r"^\s*(?:<!--)?\s*ci:\s*(?P<old>.+?)\s*=>\s*(?P<new>.+?)\s*(?:-->)?\s*$")
SKIP = re.compile(r"^skip\s*\((?P<why>[^)]+)\)\s*$")
PLACEHOLDER = re.compile(r"<([A-Za-z][\w-]*)>")
RUN_ID = re.compile(r"^\d{8}-\d{6}-\w+$")
TAIL_LINES = 40


class MarkerError(ValueError):
    """A marker or placeholder the tool cannot follow; the message names the file and line."""


@dataclass
class Command:
    doc: str
    line: int
    text: str  # the command as the docs show it, without its comment
    run: str | None  # what runs; None: skipped
    why: str = ""  # why it is skipped

    @property
    def where(self) -> str:
        return f"{self.doc}:{self.line}"


def split_comment(line: str) -> tuple[str, str]:
    """(code, comment) of one shell line: the comment starts at a ``#`` outside quotes, after a blank."""
    quote = None
    i = 0
    while i < len(line):
        ch = line[i]
        if quote:
            if ch == "\\" and quote == '"':
                i += 1
            elif ch == quote:
                quote = None
        elif ch == "\\":
            i += 1
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip(), line[i:]
        i += 1
    return line.rstrip(), ""


def _marker(comment: str, where: str) -> tuple[str | None, str] | None:
    """A trailing ``# ci: ...`` comment as (command to run or None, why skipped); None without one."""
    m = re.search(r"#\s*ci:\s*(.*)$", comment)
    if m is None:
        return None
    value = m.group(1).strip()
    if value.startswith("skip"):
        s = SKIP.match(value)
        if s is None:
            raise MarkerError(f"{where}: a skip names why: '# ci: skip (REASON)', got '# ci: {value}'")
        return None, s.group("why").strip()
    if not value:
        raise MarkerError(f"{where}: '# ci:' without a command")
    return value, ""


def _block_commands(block: list[tuple[int, str]], doc: str) -> list[Command]:
    out, buf, start = [], "", 0
    for lineno, raw in block:
        text = raw.rstrip()
        if not buf:
            if not text.strip() or text.lstrip().startswith("#"):
                continue
            start = lineno
            text = re.sub(r"^\s*\$\s+", "", text)
        if text.endswith("\\"):
            buf += text[:-1].rstrip() + " "
            continue
        code, comment = split_comment(buf + text.strip())
        buf = ""
        marked = _marker(comment, f"{doc}:{start}")
        run, why = marked if marked else (code, "")
        out.append(Command(doc, start, code, run, why))
    return out


def _apply(directives: list[tuple[int, str, str]], cmds: list[Command], doc: str) -> None:
    for lineno, old, new in directives:
        hits = [c for c in cmds if old in c.text]
        if not hits:
            raise MarkerError(f"{doc}:{lineno}: marker 'ci: {old} => ...' matches no command of the next bash block")
        skip = SKIP.match(new)
        if new.startswith("skip") and skip is None:
            raise MarkerError(f"{doc}:{lineno}: a skip names why: 'ci: {old} => skip (REASON)'")
        for c in hits:
            if skip:
                c.run, c.why = None, skip.group("why").strip()
            elif c.run is not None:
                c.run = c.run.replace(old, new, 1)


def parse(markdown: str, doc: str = "<doc>") -> list[Command]:
    """Every command of the markdown's bash blocks, with its markers applied."""
    out: list[Command] = []
    pending: list[tuple[int, str, str]] = []
    in_comment, block, fence, lang = False, None, "", ""
    for lineno, line in enumerate(markdown.splitlines(), 1):
        if block is not None:
            if line.strip().startswith(fence) and not line.strip().strip(fence[0]):
                cmds = _block_commands(block, doc)
                _apply(pending, cmds, doc)
                out += cmds
                block, pending = None, []
            elif lang in SHELLS:
                block.append((lineno, line))
            continue
        if "<!--" in line or in_comment:
            m = DIRECTIVE.match(line)
            if m:
                pending.append((lineno, m.group("old"), m.group("new")))
            in_comment = "-->" not in line
            continue
        f = FENCE.match(line)
        if f:
            fence, lang = f.group(1), f.group(2).lower()
            if pending and lang not in SHELLS:
                raise MarkerError(f"{doc}:{pending[0][0]}: a 'ci:' marker stands before a {lang or 'plain'} block")
            block = []
    if pending:
        raise MarkerError(f"{doc}:{pending[0][0]}: a 'ci:' marker with no bash block after it")
    return out


# ---------------------------------------------------------------------------------------------- running


def _runs(cwd: Path) -> set[str]:
    base = cwd / "results"
    return {p.name for p in base.iterdir() if p.is_dir() and RUN_ID.match(p.name)} if base.is_dir() else set()


def resolve(cmd: str, made: list[str], where: str) -> str:
    """Fill ``<run-id>`` and ``<base>`` with the run folders made so far; any other placeholder is an error."""
    values = {"run-id": made[-1] if made else None, "base": made[-2] if len(made) > 1 else None}

    def sub(m: re.Match) -> str:
        name = m.group(1)
        if name not in values:
            raise MarkerError(f"{where}: placeholder <{name}>: give the line a '# ci: COMMAND' marker")
        if values[name] is None:
            raise MarkerError(f"{where}: <{name}> needs {'two run folders' if name == 'base' else 'a run folder'} "
                              f"made by the commands before it")
        return values[name]

    return PLACEHOLDER.sub(sub, cmd)


def _shell(cmd: str, cwd: Path, env: dict, timeout: float, log: Path) -> tuple[int, dict]:
    """Run one command with bash; return its exit code and the environment it left."""
    env_file = log.with_suffix(".env")
    script = f"{cmd}\n__rc=$?\nenv -0 > {shlex.quote(str(env_file))}\nexit $__rc\n"
    with open(log, "wb") as out:
        proc = subprocess.Popen(["bash", "-c", script], cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _stop(proc)
            with open(log, "ab") as f:
                f.write(f"\ndoc_commands: stopped after {timeout:.0f} s\n".encode())
            return 124, env
    if not env_file.exists():
        return rc, env
    pairs = (item.split("=", 1) for item in env_file.read_text(errors="replace").split("\0") if "=" in item)
    return rc, dict(pairs)


def _stop(proc: subprocess.Popen) -> None:
    """End the command's process group (it runs in a session of its own), politely first."""
    for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def run_all(cmds: list[Command], root: Path, timeout: float) -> int:
    failed = ran = 0
    start = time.monotonic()
    logs = Path(tempfile.mkdtemp(prefix="doc-commands-"))
    doc = None
    for i, c in enumerate(cmds):
        if c.doc != doc:  # a new page: a fresh shell in the repository root
            doc, env, cwd, made = c.doc, dict(os.environ), root, []
        if c.run is None:
            print(f"doc-commands: skip        {c.where}  {c.text}  ({c.why})", flush=True)
            continue
        try:
            cmd = resolve(c.run, made, c.where)
        except MarkerError as e:
            print(f"doc-commands: error       {e}", flush=True)
            failed += 1
            continue
        before, t0, log = _runs(cwd), time.monotonic(), logs / f"{i:02d}.log"
        rc, env = _shell(cmd, cwd, env, timeout, log)
        cwd = Path(env.get("PWD", cwd))
        made += sorted(_runs(cwd) - before)
        ran += 1
        print(f"doc-commands: rc {rc:<3} {time.monotonic() - t0:6.1f} s  {c.where}  {cmd}", flush=True)
        if rc:
            failed += 1
            tail = log.read_text(errors="replace").splitlines()[-TAIL_LINES:]
            print("\n".join(f"    {t}" for t in tail) + f"\n    (whole output: {log})", flush=True)
    print(f"doc-commands: {ran} ran, {sum(c.run is None for c in cmds)} skipped, {failed} failed, "
          f"in {time.monotonic() - start:.0f} s", flush=True)
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.doc_commands", description=__doc__.split("\n")[0])
    ap.add_argument("files", nargs="*", default=list(DOCS), help="markdown files, relative to the repository root")
    ap.add_argument("--list", action="store_true", help="print what would run, run nothing")
    ap.add_argument("--timeout", type=float, default=600, help="seconds one command may take (default 600)")
    args = ap.parse_args(argv)
    cmds: list[Command] = []
    try:
        for name in args.files:
            path = ROOT / name
            if not path.exists():
                raise MarkerError(f"{name}: no such file")
            cmds += parse(path.read_text(), name)
    except MarkerError as e:
        print(f"doc-commands: {e}", file=sys.stderr)
        return 2
    if args.list:
        for c in cmds:
            print(f"{c.where}: " + (c.run if c.run is not None else f"skip ({c.why}): {c.text}"))
        return 0
    return run_all(cmds, ROOT, args.timeout)


if __name__ == "__main__":
    raise SystemExit(main())
