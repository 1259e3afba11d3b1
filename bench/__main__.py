"""``python -m bench ...`` is the ``parbench`` command."""

import sys

from bench.cli.main import main

sys.exit(main())
