"""nox sessions: bench (default matrix + report), tests, lint.

torch is installed first and pinned: on a machine without a GPU set PARBENCH_TORCH_INDEX to a CPU
wheel index (e.g. https://download.pytorch.org/whl/cpu) if plain PyPI would give you a CUDA build.
"""

import os

import nox

nox.options.sessions = ["tests"]
TORCH = os.environ.get("PARBENCH_TORCH", "torch==2.13.0")


def install(session: nox.Session, *extras: str) -> None:
    index = os.environ.get("PARBENCH_TORCH_INDEX")
    session.install(TORCH, *(["--index-url", index] if index else []))
    session.install("-e", f".[{','.join(extras)}]" if extras else ".")


@nox.session
def bench(session: nox.Session) -> None:
    """Run the default matrix for this machine and write its HTML report."""
    install(session)
    try:
        session.run("parbench", "run", "--report", *session.posargs)
    finally:
        # said last, after the run's own last lines, also when it fails or is interrupted (nox raises
        # then): the way to `parbench report`, `compare` or `run --resume` is the last thing on screen
        session.log(f"parbench is installed in this session's virtualenv: "
                    f"source {session.virtualenv.location}/bin/activate")


@nox.session
def tests(session: nox.Session) -> None:
    """The test suite: unit, distributed (real gloo processes), GPU tests skip without CUDA."""
    install(session, "dev")
    session.run("pytest", "-q", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    session.install("ruff")
    session.run("ruff", "check", "bench", "strategies", "reports", "tests", "noxfile.py")
