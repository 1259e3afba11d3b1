"""Background telemetry: one sampler thread per host, in the launcher process (not in the ranks,
so it takes no time from the training processes' Python threads).

Rows are ``host, device, t, metric, value`` with ``t`` in Unix seconds (``time.time()``), the same
clock the workers stamp their timed windows and steps with, so the report can place samples
against steps.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any, Protocol

from bench.measure.host import HostSource
from bench.measure.nvml import NvmlSource


class Source(Protocol):
    name: str

    def sample(self, t: float) -> list[tuple[str, str, float]]:
        """(device, metric, value) triples for one tick."""
        ...

    def notes(self) -> dict[str, str]:
        ...


class Sampler(threading.Thread):
    """Calls every source at ``hz`` on a fixed schedule (a late tick is skipped, not bunched)."""

    def __init__(self, sources: list[Source], hz: float):
        super().__init__(name="parbench-sampler", daemon=True)
        if not 0 < hz <= 1000:
            raise ValueError(f"sample rate {hz} Hz must be in (0, 1000]")
        self.sources, self.period = sources, 1.0 / hz
        self.host = socket.gethostname()
        self.rows: list[dict[str, Any]] = []
        self.ticks = 0
        self._halt = threading.Event()
        self._lock = threading.Lock()

    def run(self) -> None:
        nxt = time.monotonic()
        while not self._halt.is_set():
            t = time.time()
            batch = []
            for src in self.sources:
                for device, metric, value in src.sample(t):
                    batch.append({"host": self.host, "device": device, "t": t, "metric": metric, "value": value})
            with self._lock:
                self.rows.extend(batch)
                self.ticks += 1
            nxt += self.period
            delay = nxt - time.monotonic()
            if delay < 0:  # fell behind: skip the missed ticks
                nxt = time.monotonic()
                delay = 0
            self._halt.wait(delay)

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=5)

    def drain(self) -> list[dict[str, Any]]:
        """The rows sampled since the last drain; the sampler keeps no more than that, so a long
        run's memory does not grow with its samples (the launcher appends them to disk)."""
        with self._lock:
            rows, self.rows = self.rows, []
        return rows

    def notes(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for s in self.sources:
            out.update(s.notes())
        return out


def start_samplers(hz: float, *, gpu: bool) -> tuple[Sampler | None, dict[str, str]]:
    """The host sampler always; the NVML sampler when ``gpu`` and NVML answers. Returns the
    running sampler (None when hz is 0) and notes for meta.json (why a sampler is absent)."""

    notes: dict[str, str] = {}
    if hz <= 0:
        return None, {"samplers": "off (sample_hz = 0)"}
    sources: list[Source] = [HostSource()]
    if gpu:

        try:
            sources.append(NvmlSource())
        except Exception as e:  # noqa: BLE001 - no driver, no library: say so, invent nothing
            notes["nvml_sampler"] = f"absent: {type(e).__name__}: {e}"
    else:
        notes["nvml_sampler"] = "absent: CPU run"
    s = Sampler(sources, hz)
    s.start()
    return s, notes
