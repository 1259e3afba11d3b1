"""How a parbench process ends when code it imported (a user's workload) left a thread running."""

from __future__ import annotations

import os
import sys
import threading


def exit_with(code: int | None, what: str = "parbench") -> None:
    """End the process with ``code``. Where a non-daemon thread that parbench did not start is still
    running (a user's data loader worker), which would keep the interpreter alive after its work
    is done: one line on stderr names it, then the process ends without waiting for it."""
    # a ThreadPoolExecutor's workers (torch.compile's on CPU, for one) end at exit by themselves
    left = [t.name for t in threading.enumerate() if t is not threading.main_thread() and t.is_alive()
            and not t.daemon and not t.name.startswith("ThreadPoolExecutor")]
    if not left:
        sys.exit(code)
    print(f"{what}: ending with thread(s) still running that parbench did not start ({', '.join(left[:3])}); "
          "they were stopped with the process", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code if isinstance(code, int) else 1)
