"""docs/guides/settings.md, generated from the settings' declarations (bench/core/settings.py).

``python -m tools.settings_page`` prints the page; ``--write`` writes it. ``tests/docs/
test_settings_page.py`` keeps the committed page equal to this output: after changing a setting,
run ``python -m tools.settings_page --write``.
"""

from __future__ import annotations

from pathlib import Path

from bench.core import knobs, settings
from bench.core.config import default_config
from tools.generated import page_main

PAGE = Path(__file__).resolve().parents[1] / "docs" / "guides" / "settings.md"

INTRO = """# Settings of a run

Every setting of `parbench run`, by section. Give one as a flag, or in a TOML file passed with
`--config FILE`, either flat or in its section's table (flags win over the file):

```toml
workloads = ["gpt-tiny"]          # flat

[measurement]                     # or by section
steps = 30
repeats = 3

[training]                        # the training knobs, each a list to compare, and lr
compile = ["off", "on"]
```

A run folder's `meta.json` keeps the settings it ran with under `config`, by the same keys, and
`parbench run --resume RUN` takes them from there. This page is generated from the declarations in
`bench/core/settings.py` (`python -m tools.settings_page --write`).
"""


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("%%", "%")


def _default(d: settings.Declared) -> str:
    v = default_config(0).flat()[d.key]  # a machine without a GPU's (the declared default, or its overlay)
    if d.kind == "off":
        return "on"
    return "—" if v in (None, {}, []) else f"`{v}`"


def page() -> str:
    out = [INTRO]
    for sec, cls in settings.SECTIONS.items():
        doc = " ".join((cls.__doc__ or "").split())
        out.append(f"\n## [{sec}]\n\n{doc}\n")
        out.append("| key | flag | default (no GPU) | meaning |\n|---|---|---|---|")
        for d in settings.DECLARED:
            if d.section != sec or not d.toml or d.key == "training":
                continue
            out.append(f"| `{d.key}` | {f'`{d.flag}`' if d.flag else 'TOML only'} | {_default(d)} | {_cell(d.help)} |")
        if sec == "training":
            for f in knobs.KNOBS:
                out.append(f"| `{f.name}` | `--{f.name}` | `[\"{f.default}\"]` | {_cell(f.metadata['help'])} |")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    return page_main(argv, prog="python -m tools.settings_page", doc=__doc__, page=page, path=PAGE)


if __name__ == "__main__":
    raise SystemExit(main())
