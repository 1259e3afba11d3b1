"""The fault suite's table: outcome counts by command, printed at the end of the session and written
to ``$PARBENCH_FAULT_TABLE`` (CSV) when that is set."""

from __future__ import annotations

import os
from collections import Counter

from tests.faults.harness import OUTCOMES, RECORDED


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if not RECORDED:
        return
    counts = Counter((cmd, outcome) for cmd, _, outcome in RECORDED)
    commands = sorted({cmd for cmd, _, _ in RECORDED})
    head = f"{'command':<10}" + "".join(f"{o:>10}" for o in OUTCOMES) + f"{'cases':>8}"
    rows = [f"{c:<10}" + "".join(f"{counts[c, o]:>10}" for o in OUTCOMES)
            + f"{sum(counts[c, o] for o in OUTCOMES):>8}" for c in commands]
    total = f"{'all':<10}" + "".join(f"{sum(counts[c, o] for c in commands):>10}" for o in OUTCOMES) \
        + f"{len(RECORDED):>8}"
    terminalreporter.write_sep("-", "fault cases by command and outcome")
    for line in (head, *rows, total):
        terminalreporter.write_line(line)
    path = os.environ.get("PARBENCH_FAULT_TABLE")
    if path:
        with open(path, "w") as f:
            f.write("command,case,outcome\n" + "".join(f"{c},{i},{o}\n" for c, i, o in RECORDED))
