"""A fingerprint of the machine a run measured: what can make the same code run at another speed.

Static facts go to ``meta.json`` once (CPU model, cgroup CPU quota, GPU clocks and power limits,
ECC and persistence mode, the NVLink/PCIe topology, NCCL version and the environment variables
that change communication). What changes during a run (load, other processes, clock throttling)
is sampled by the launcher's samplers and summarised per cell (``contended``, ``host_load1``, ...).

Environment variables are recorded from an allowlist of prefixes only, and never one whose name
looks like a credential.
"""

from __future__ import annotations

import os
import platform
import re
from pathlib import Path
from typing import Any

from bench.core.rankenv import RANK_ENV_DEFAULTS
from bench.measure.hardware import cpu_threads
from bench.measure.topology import topology

#: variables recorded: these prefixes, or these exact names
ENV_PREFIXES = ("NCCL_", "TORCH_", "CUDA_", "NVIDIA_", "OMP_", "MKL_", "GLOO_", "PYTORCH_", "KMP_")
ENV_NAMES = ("WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_PORT", "SLURM_JOB_ID", "SLURM_NNODES", "TEARDOWN_CUPTI",
             "DISABLE_CUPTI_LAZY_REINIT")
_SECRET = re.compile(r"KEY|TOKEN|SECRET|PASSW|CREDENTIAL|AUTH|COOKIE|SESSION", re.IGNORECASE)


def environment(env: dict[str, str] | None = None) -> dict[str, str]:
    """The allowlisted variables in effect (sorted); nothing that looks like a credential."""
    env = dict(os.environ if env is None else env)
    return {k: v for k, v in sorted(env.items())
            if (k.startswith(ENV_PREFIXES) or k in ENV_NAMES) and not _SECRET.search(k)}


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cgroup_cpu_quota() -> float | None:
    """CPUs the cgroup may use (cgroup v2 cpu.max, v1 cfs quota), None when unlimited or unknown."""
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota = int(Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").read_text())
        period = int(Path("/sys/fs/cgroup/cpu/cpu.cfs_period_us").read_text())
        return None if quota <= 0 else quota / period
    except (OSError, ValueError):
        return None


def gpu_state(nvml: Any = None) -> list[dict[str, Any]]:
    """Per GPU: max and current SM/memory clocks, power limit (enforced and default), ECC and
    persistence mode, compute mode. Empty without NVML; a query a GPU refuses is left out."""
    try:
        nv = nvml
        if nv is None:
            import pynvml as nv
        nv.nvmlInit()
    except Exception:  # noqa: BLE001 - no NVML, no GPU facts
        return []

    def q(fn, *a):
        try:
            return fn(*a)
        except Exception:  # noqa: BLE001
            return None

    out = []
    for i in range(q(nv.nvmlDeviceGetCount) or 0):
        h = nv.nvmlDeviceGetHandleByIndex(i)
        ecc = q(nv.nvmlDeviceGetEccMode, h)
        limit = q(nv.nvmlDeviceGetEnforcedPowerLimit, h)
        default = q(nv.nvmlDeviceGetPowerManagementDefaultLimit, h)
        out.append({
            "index": i, "name": q(nv.nvmlDeviceGetName, h),
            "sm_clock_max_mhz": q(nv.nvmlDeviceGetMaxClockInfo, h, nv.NVML_CLOCK_SM),
            "mem_clock_max_mhz": q(nv.nvmlDeviceGetMaxClockInfo, h, nv.NVML_CLOCK_MEM),
            "sm_clock_mhz": q(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM),
            "power_limit_w": limit / 1000 if limit else None,
            "power_limit_default_w": default / 1000 if default else None,
            "ecc_current": ecc[0] if ecc else None,
            "persistence_mode": q(nv.nvmlDeviceGetPersistenceMode, h),
            "compute_mode": q(nv.nvmlDeviceGetComputeMode, h),
        })
    return out


def fingerprint() -> dict[str, Any]:
    """The static fingerprint for meta.json."""

    # What the ranks run with: the launcher's environment plus the fixed defaults it gives every
    # rank (OMP_NUM_THREADS is set per launch, from the cores and that launch's ranks, and is
    # recorded here only where the user set it).
    env = {**RANK_ENV_DEFAULTS, **os.environ}
    fp: dict[str, Any] = {"cpu_model": cpu_model(), "cpu_threads": cpu_threads(), "cgroup_cpus": cgroup_cpu_quota(),
                          "load_avg": list(os.getloadavg()), "env": environment(env), "gpu_state": gpu_state()}
    if fp["gpu_state"]:
        try:

            fp["topology"] = topology()
        except Exception as e:  # noqa: BLE001 - a fingerprint never stops a run
            fp["topology"] = {"available": False, "why": f"{type(e).__name__}: {e}"}
    return fp


def key(meta: dict[str, Any]) -> str:
    """A short identity of a machine, for grouping runs: host, GPU models, CPU model, torch and NCCL."""
    fp = meta.get("fingerprint", {})
    parts = [meta.get("host"), ",".join(meta.get("gpus") or []) or "no-gpu", fp.get("cpu_model"),
             meta.get("torch"), meta.get("nccl")]
    return " | ".join(str(p) for p in parts)
