"""Every test here is of a developer tool (tools/), not of parbench: they carry the ``tools``
marker, which the README's test command leaves out and .ci/run runs with the fault cases."""

from pathlib import Path

import pytest

HERE = Path(__file__).parent


def pytest_collection_modifyitems(config, items):
    for item in items:
        if HERE in Path(item.fspath).parents:
            item.add_marker(pytest.mark.tools)
