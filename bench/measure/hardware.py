"""What the machine has, and the peak rates MFU is computed against.

Peaks are dense (no sparsity) vendor datasheet figures, matched on the CUDA device name. A GPU not
in the table gets no MFU: an empty cell, never a guess.
"""

from __future__ import annotations

import os

# (name substring, dense bf16 TFLOP/s, fp32 TFLOP/s without tensor cores). The longest substring
# found in the device name wins, so "H200 NVL" is never read as "H200" (SXM).
PEAK_TFLOPS: list[tuple[str, float, float]] = [
    ("H200 NVL", 835.0, 60.0),  # H200 NVL (PCIe card, lower power): 1671 sparse / 2
    ("H200", 989.4, 66.9),  # H200 SXM: same SMs and clocks as H100 SXM
    ("H100 80GB HBM3", 989.4, 66.9),  # H100 SXM5
    ("H100 PCIe", 756.0, 51.2),
    ("H100 NVL", 835.0, 60.0),
    ("A100", 312.0, 19.5),  # SXM and PCIe share the dense tensor-core peak
]


def peak_flops(device_name: str, precision: str) -> float | None:
    """Peak FLOP/s for ``precision`` ('bf16' or 'fp32') on the named GPU, or None if unknown."""
    found = [(len(key), bf16, fp32) for key, bf16, fp32 in PEAK_TFLOPS if key in device_name]
    if not found:
        return None
    _, bf16, fp32 = max(found)
    return (bf16 if precision == "bf16" else fp32) * 1e12


def gpu_count() -> int:
    """Visible CUDA devices (0 where CUDA is absent or broken). A machine without an NVIDIA driver
    answers 0 without importing torch (seconds on a loaded machine), so that bad input there is
    refused at once."""
    if not _nvidia_driver():
        return 0
    import torch

    try:
        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # noqa: BLE001 - a broken driver means no GPU for us
        return 0


def _nvidia_driver() -> bool:
    """Whether NVML finds an NVIDIA driver (False: certainly no CUDA device; True: torch counts them)."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no library, no driver: no GPU
        return False
    try:
        pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001
        pass
    return True


def gpu_names() -> list[str]:
    import torch

    return [torch.cuda.get_device_name(i) for i in range(gpu_count())]


def cpu_threads() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def threads_per_rank(ranks: int) -> int:
    """OMP_NUM_THREADS for one of ``ranks`` processes sharing this host: its CPUs divided among them
    (torchrun sets 1 only for several ranks; a lone worker would otherwise oversubscribe)."""
    return max(1, cpu_threads() // ranks)
