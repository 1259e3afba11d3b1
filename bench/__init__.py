"""parbench: benchmark and profile parallelism strategies in PyTorch on the same workload."""

from __future__ import annotations

import re
from pathlib import Path

SCHEMA_VERSION = 1


def installed_version() -> str:
    """parbench's version as installed (the package metadata); in a source tree that was never
    installed, pyproject.toml's; "unknown" when neither can be read."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("parbench")
    except PackageNotFoundError:
        return pyproject_version(Path(__file__).resolve().parents[1] / "pyproject.toml")


def pyproject_version(path: Path) -> str:
    """[project] version of a pyproject.toml ("unknown" when it has none or cannot be read)."""
    try:
        text = path.read_text()
    except OSError:
        return "unknown"
    project = re.search(r"(?ms)^\[project\]\s*$(.*?)(?=^\[|\Z)", text)
    found = re.search(r"""(?m)^version\s*=\s*["']([^"']+)["']""", project.group(1)) if project else None
    return found.group(1) if found else "unknown"


__version__ = installed_version()
