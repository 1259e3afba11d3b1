"""The command line of a page generated from the code (``tools.columns_page``, ``tools.settings_page``):
print the page, or ``--write`` it where it is committed."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path


def page_main(argv: list[str] | None, *, prog: str, doc: str, page: Callable[[], str], path: Path) -> int:
    """Print ``page()``, or with ``--write`` write it to ``path``."""
    ap = argparse.ArgumentParser(prog=prog, description=doc.splitlines()[0])
    ap.add_argument("--write", action="store_true", help=f"write the page to {path.relative_to(path.parents[2])}")
    args = ap.parse_args(argv)
    text = page()
    if args.write:
        path.write_text(text, encoding="utf-8")
        print(f"wrote {path}")
    else:
        sys.stdout.write(text)
    return 0
