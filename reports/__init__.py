"""Run folder -> figures (matplotlib) -> one HTML page (jinja2) that opens from disk."""

from reports.html import build_report

__all__ = ["build_report"]
