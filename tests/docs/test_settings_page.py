"""docs/guides/settings.md is generated from the settings' declarations (tools/settings_page.py):
the committed page must equal what the tool writes now, and name every setting a user gives."""

from __future__ import annotations

from bench.core import knobs, settings
from tools import settings_page


def test_committed_settings_page_is_the_generated_one():
    assert settings_page.PAGE.read_text(encoding="utf-8") == settings_page.page(), (
        "docs/guides/settings.md is out of date with bench/core/settings.py: run python -m tools.settings_page --write")


def test_every_setting_and_knob_is_on_the_page():
    text = settings_page.page()
    keys = [d.key for d in settings.DECLARED if d.toml and d.key != "training"] + list(knobs.NAMES)
    assert [k for k in keys if f"| `{k}` |" not in text] == []
