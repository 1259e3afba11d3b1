"""Host telemetry with psutil: CPU utilisation, memory of the benchmark's processes, network, and
contention: cores busy outside the benchmark's process tree, load average, stolen CPU."""

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
        self._busy: tuple[float, float, float, float] | None = None
        self._gone_s = 0.0
        self._cpu_by_pid: dict[int, float] = {}

    def _children(self) -> list[psutil.Process]:
        # Enumerating the process tree costs milliseconds: refresh it twice a second at most.
        now = time.monotonic()
        if now - self._procs_at > 0.5:
            self._procs = self.me.children(recursive=True)
            self._procs_at = now
        return self._procs

    def _tree_cpu_s(self) -> float:
        """CPU seconds used so far by the benchmark's processes (this one and its children, those
        that have exited included: their last reading is kept, so the sum never drops)."""
        seen = {}
        for p in [self.me, *self._children()]:
            try:
                c = p.cpu_times()
                seen[p.pid] = c.user + c.system
            except psutil.Error:
                continue
        for pid, last in self._cpu_by_pid.items():
            if pid not in seen:
                self._gone_s += last
        self._cpu_by_pid = seen
        return self._gone_s + sum(seen.values())

    def sample(self, t: float) -> list[tuple[str, str, float]]:
        rss = 0
        for p in self._children():
            try:
                rss += p.memory_info().rss
            except psutil.Error:
                continue
        # Contention: cores busy outside the benchmark's own processes (another job on the host),
        # the 1-minute load and, on a VM, CPU stolen by the hypervisor.
        busy = psutil.cpu_times()
        busy_s = sum(getattr(busy, f, 0.0) for f in ("user", "nice", "system", "irq", "softirq", "steal"))
        mine_s = self._tree_cpu_s()
        now = time.monotonic()
        contention = []
        if self._busy is not None:
            dt = max(now - self._busy[2], 1e-6)
            other = max(0.0, (busy_s - self._busy[0]) - (mine_s - self._busy[1])) / dt
            steal = (getattr(busy, "steal", 0.0) - self._busy[3]) / dt
            contention = [("host", "other_cpu_cores", other), ("host", "cpu_steal_cores", max(steal, 0.0))]
        self._busy = (busy_s, mine_s, now, getattr(busy, "steal", 0.0))
        contention.append(("host", "load1", os.getloadavg()[0]))
        net = psutil.net_io_counters()
        dt = max(t - self._net_t, 1e-6)
        out = [("host", "cpu_util_pct", psutil.cpu_percent(interval=None)),
               ("host", "bench_rss_bytes", float(rss)),
               ("host", "mem_used_bytes", float(psutil.virtual_memory().used)),
               ("host", "net_tx_bytes_s", (net.bytes_sent - self._net.bytes_sent) / dt),
               ("host", "net_rx_bytes_s", (net.bytes_recv - self._net.bytes_recv) / dt)]
        self._net, self._net_t = net, t
        return out + contention

    def notes(self) -> dict[str, str]:
        return {}
