"""GPU telemetry through NVML (nvidia-ml-py).

Every tick, for every local GPU: utilisation (GPU, memory), memory used, power, SM clock,
temperature; PCIe and NVLink throughput from NVML's byte counters (field values) where the GPU
answers; SM activity and tensor-pipe activity from GPM where ``nvmlGpmQueryDeviceSupport`` says so.
A query that fails once is dropped for the run and named in meta.json.

Energy is not sampled here: ``nvmlDeviceGetTotalEnergyConsumption`` costs milliseconds a call, so
the workers read it once at the start and once at the end of each cell's timed steps
(:class:`EnergyMeter`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pynvml as nv

from bench.measure.slowdown import POWER_CAP, THROTTLED

UINT_MAX = 0xFFFFFFFF
#: clock-event reasons that slow running kernels: SW power cap, HW slowdown, SW/HW thermal, power brake
SLOWDOWN_MASK = POWER_CAP | THROTTLED


def _counter_fields() -> dict[str, tuple[int, int, float]]:
    """metric -> (field id, scope, bytes per counter unit)."""
    return {
        "pcie_tx_bytes_s": (nv.NVML_FI_DEV_PCIE_COUNT_TX_BYTES, 0, 1.0),
        "pcie_rx_bytes_s": (nv.NVML_FI_DEV_PCIE_COUNT_RX_BYTES, 0, 1.0),
        "nvlink_tx_bytes_s": (nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, UINT_MAX, 1024.0),  # KiB counters
        "nvlink_rx_bytes_s": (nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, UINT_MAX, 1024.0),
    }


def _value(fv) -> float:
    kinds = {nv.NVML_VALUE_TYPE_DOUBLE: "dVal", nv.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
             nv.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal", nv.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
             nv.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal"}
    return float(getattr(fv.value, kinds.get(fv.valueType, "ullVal")))


def visible_indices(count: int) -> list[int]:
    """NVML indices of the GPUs CUDA numbers 0..n-1 (CUDA_VISIBLE_DEVICES given as integers or UUIDs).

    NVML numbers GPUs in PCI order; CUDA's default order agrees on machines of one GPU model."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is None:
        return list(range(count))
    out = []
    for item in [x.strip() for x in env.split(",") if x.strip()]:
        if item.isdigit():
            out.append(int(item))
        else:
            for i in range(count):
                if nv.nvmlDeviceGetUUID(nv.nvmlDeviceGetHandleByIndex(i)).startswith(item):
                    out.append(i)
    return out


class NvmlSource:
    name = "nvml"

    def __init__(self):
        nv.nvmlInit()
        count = nv.nvmlDeviceGetCount()
        # Device names follow CUDA's numbering (gpu0 = cuda:0), the numbering cells use.
        self.gpus = [(f"gpu{k}", nv.nvmlDeviceGetHandleByIndex(i)) for k, i in enumerate(visible_indices(count))]
        if not self.gpus:
            raise RuntimeError("NVML sees no GPU")
        self._notes: dict[str, str] = {}
        self._dead: set[str] = set()
        self._last: dict[tuple[str, str], tuple[float, float]] = {}
        self.fields = _counter_fields()
        self.gpm: dict[str, Any] = {}
        for dev, h in self.gpus:
            try:
                if nv.nvmlGpmQueryDeviceSupport(h).isSupportedDevice:
                    s = nv.nvmlGpmSampleAlloc()
                    nv.nvmlGpmSampleGet(h, s)
                    self.gpm[dev] = [s, nv.nvmlGpmSampleAlloc()]
                else:
                    self._notes["gpm"] = "not supported on this GPU (nvmlGpmQueryDeviceSupport)"
            except nv.NVMLError as e:
                self._notes["gpm"] = f"unavailable: {e}"

    def _try(self, key: str, fn: Callable[[], Any]) -> Any:
        if key in self._dead:
            return None
        try:
            return fn()
        except nv.NVMLError as e:
            self._dead.add(key)
            self._notes[key] = f"dropped: {e}"
            return None

    def sample(self, t: float) -> list[tuple[str, str, float]]:
        out: list[tuple[str, str, float]] = []
        for dev, h in self.gpus:
            u = self._try("utilization", lambda: nv.nvmlDeviceGetUtilizationRates(h))
            if u is not None:
                out += [(dev, "gpu_util_pct", float(u.gpu)), (dev, "mem_util_pct", float(u.memory))]
            m = self._try("memory", lambda: nv.nvmlDeviceGetMemoryInfo(h))
            if m is not None:
                out.append((dev, "mem_used_bytes", float(m.used)))
            p = self._try("power", lambda: nv.nvmlDeviceGetPowerUsage(h))
            if p is not None:
                out.append((dev, "power_w", p / 1000.0))
            c = self._try("sm_clock", lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM))
            if c is not None:
                out.append((dev, "sm_clock_mhz", float(c)))
            tc = self._try("temperature", lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU))
            if tc is not None:
                out.append((dev, "temp_c", float(tc)))
            th = self._try("throttle_reasons", lambda: nv.nvmlDeviceGetCurrentClocksThrottleReasons(h))
            if th is not None:  # only the reasons that slow a running kernel (not idle, not app clocks)
                out.append((dev, "throttle_reasons", float(int(th) & SLOWDOWN_MASK)))
            others = self._other_processes(h)
            if others is not None:
                out.append((dev, "other_procs", float(others)))
            out += self._counters(dev, h, t)
            out += self._gpm(dev, h)
        return out

    def _other_processes(self, h) -> int | None:
        """Compute processes on this GPU outside the benchmark's process tree; None when NVML's
        process ids are from another PID namespace (a container: none of ours appear)."""
        procs = self._try("processes", lambda: nv.nvmlDeviceGetComputeRunningProcesses(h))
        if not procs:
            return None if procs is None else 0
        import psutil

        me = psutil.Process()
        try:
            tree = {me.pid, *(p.pid for p in me.children(recursive=True))}
        except psutil.Error:
            return None
        pids = {p.pid for p in procs}
        if not pids & tree:
            self._notes.setdefault("processes", "NVML process ids are from another PID namespace: "
                                                "other processes on a GPU cannot be told apart")
            return None
        return len(pids - tree)

    def _counters(self, dev: str, h, t: float) -> list[tuple[str, str, float]]:
        live = {k: v for k, v in self.fields.items() if k not in self._dead}
        if not live:
            return []
        vals = self._try("field_values", lambda: nv.nvmlDeviceGetFieldValues(h, [(f, s) for f, s, _ in live.values()]))
        if vals is None:
            return []
        out = []
        for (metric, (_, _, unit)), fv in zip(live.items(), vals):
            if fv.nvmlReturn != nv.NVML_SUCCESS:
                self._dead.add(metric)
                self._notes[metric] = f"not reported (NVML return {fv.nvmlReturn})"
                continue
            v = _value(fv) * unit
            prev = self._last.get((dev, metric))
            self._last[(dev, metric)] = (t, v)
            if prev is not None and t > prev[0]:
                out.append((dev, metric, max(0.0, v - prev[1]) / (t - prev[0])))
        return out

    def _gpm(self, dev: str, h) -> list[tuple[str, str, float]]:
        pair = self.gpm.get(dev)
        if pair is None or "gpm" in self._dead:
            return []
        prev, cur = pair
        if self._try("gpm", lambda: nv.nvmlGpmSampleGet(h, cur)) is None:
            return []
        mg = nv.c_nvmlGpmMetricsGet_t()
        mg.version = nv.NVML_GPM_METRICS_GET_VERSION
        mg.numMetrics = 2
        mg.sample1, mg.sample2 = prev, cur
        mg.metrics[0].metricId = nv.NVML_GPM_METRIC_SM_UTIL
        mg.metrics[1].metricId = nv.NVML_GPM_METRIC_ANY_TENSOR_UTIL
        res = self._try("gpm", lambda: nv.nvmlGpmMetricsGet(mg))
        pair.reverse()  # this sample is the next tick's "previous"
        if res is None:
            return []
        out = []
        for i, metric in enumerate(("sm_active_pct", "tensor_active_pct")):
            if res.metrics[i].nvmlReturn == nv.NVML_SUCCESS:
                out.append((dev, metric, float(res.metrics[i].value)))
        return out

    def notes(self) -> dict[str, str]:
        return {f"nvml_{k}": v for k, v in self._notes.items()}


class EnergyMeter:
    """Total energy (J) of some local GPUs, from NVML's cumulative counter; ``read()`` is None where
    NVML or the counter is unavailable."""

    def __init__(self, cuda_indices: list[int]):
        self.handles: list[Any] = []
        try:
            nv.nvmlInit()
            count = nv.nvmlDeviceGetCount()
            nvml_idx = visible_indices(count)
            self.handles = [nv.nvmlDeviceGetHandleByIndex(nvml_idx[i]) for i in cuda_indices]
        except Exception:  # noqa: BLE001 - no energy figure is the honest answer
            self.handles = []

    def read(self) -> float | None:
        if not self.handles:
            return None
        try:
            return sum(nv.nvmlDeviceGetTotalEnergyConsumption(h) for h in self.handles) / 1000.0  # mJ -> J
        except nv.NVMLError:
            self.handles = []
            return None


def process_used_bytes(cuda_index: int, pid: int | None = None) -> float | None:
    """What NVML sees process ``pid`` (this one by default) use on CUDA device ``cuda_index``: its
    allocator's reservation, the CUDA context, NCCL's buffers. None where NVML does not say (no
    NVML, or a container whose process ids NVML does not share)."""
    pid = os.getpid() if pid is None else pid
    try:
        nv.nvmlInit()
        try:
            handle = nv.nvmlDeviceGetHandleByIndex(visible_indices(nv.nvmlDeviceGetCount())[cuda_index])
            used = [p.usedGpuMemory for p in nv.nvmlDeviceGetComputeRunningProcesses(handle) if p.pid == pid]
        finally:
            nv.nvmlShutdown()
    except Exception:  # noqa: BLE001 - no figure is the honest answer
        return None
    return float(used[0]) if used and used[0] is not None else None
