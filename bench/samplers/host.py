"""Host telemetry with psutil: CPU utilisation, memory of the benchmark's processes, network."""

from __future__ import annotations

import os
import time

import psutil


class HostSource:
    name = "host"

    def __init__(self):
        self.me = psutil.Process(os.getpid())
        psutil.cpu_percent(interval=None)  # prime: the first call has no interval to measure
        self._procs: list[psutil.Process] = []
        self._procs_at = 0.0
        self._net = psutil.net_io_counters()
        self._net_t = time.time()

    def _children(self) -> list[psutil.Process]:
        # Enumerating the process tree costs milliseconds: refresh it twice a second at most.
        now = time.monotonic()
        if now - self._procs_at > 0.5:
            self._procs = self.me.children(recursive=True)
            self._procs_at = now
        return self._procs

    def sample(self, t: float) -> list[tuple[str, str, float]]:
        rss = 0
        for p in self._children():
            try:
                rss += p.memory_info().rss
            except psutil.Error:
                continue
        net = psutil.net_io_counters()
        dt = max(t - self._net_t, 1e-6)
        out = [("host", "cpu_util_pct", psutil.cpu_percent(interval=None)),
               ("host", "bench_rss_bytes", float(rss)),
               ("host", "mem_used_bytes", float(psutil.virtual_memory().used)),
               ("host", "net_tx_bytes_s", (net.bytes_sent - self._net.bytes_sent) / dt),
               ("host", "net_rx_bytes_s", (net.bytes_recv - self._net.bytes_recv) / dt)]
        self._net, self._net_t = net, t
        return out

    def notes(self) -> dict[str, str]:
        return {}
