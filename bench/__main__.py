"""``python -m bench ...`` is the ``parbench`` command."""

from bench.cli.main import entry

entry()
