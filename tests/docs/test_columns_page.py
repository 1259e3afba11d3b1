"""docs/guides/columns.md is generated from the metric registry (tools/columns_page.py): the
committed page must equal what the tool writes now."""

from __future__ import annotations

from tools import columns_page


def test_committed_columns_page_is_the_generated_one():
    committed = columns_page.PAGE.read_text(encoding="utf-8")
    assert committed == columns_page.page(), (
        "docs/guides/columns.md is out of date with the metric registry: run python -m tools.columns_page --write")


def test_every_cells_column_is_on_the_page():
    from bench.results.columns import all_metrics

    text = columns_page.page()
    missing = [m.name for m in all_metrics() if f"| `{m.name}` |" not in text]
    assert not missing, missing
