"""Cells that cannot fit, known before anything starts.

Training holds at least each parameter's fp32 value and its gradient (8 bytes; the strategies'
SGD keeps no optimizer state, bf16 autocast keeps fp32 parameters). A strategy that keeps a whole
copy of the model on every device needs 8 bytes a parameter on each; one that cuts the model in n
parts needs at least 1/n of that on its fullest device. Activations, buffers and the CUDA context
come on top, so this lower bound never skips a cell that could run: it only spares the budget the
cells that would certainly run out of memory (a 20B-parameter model on one 80 GB GPU), and says
why in words the recommendation reads as running out of memory.
"""

from __future__ import annotations

from bench.core.spec import CellSpec

BYTES_PER_PARAM = 8  # fp32 value + fp32 gradient


def device_memory(device: str) -> int | None:
    """Bytes a cell's device holds: the largest visible GPU's (NVML), or the host's memory on CPU
    (shared by the ranks of a node); None when unknown."""
    try:
        if device == "cuda":
            import pynvml as nv

            nv.nvmlInit()
            try:
                return max(nv.nvmlDeviceGetMemoryInfo(nv.nvmlDeviceGetHandleByIndex(i)).total
                           for i in range(nv.nvmlDeviceGetCount()))
            finally:
                nv.nvmlShutdown()
        import psutil

        return int(psutil.virtual_memory().total)
    except Exception:  # noqa: BLE001 - no NVML or psutil: nothing is skipped for memory
        return None


def memory_reason(cell: CellSpec, share: float, memory: int | None) -> str | None:
    """Why ``cell`` cannot fit, or None: its parameters and gradients at ``share`` of the model on
    its fullest device (on CPU, the node's ranks together) against ``memory``."""
    params = cell.workload.params
    if not params or not memory or cell.nnodes > 1:
        return None
    per_device = BYTES_PER_PARAM * params * share
    if cell.device == "cuda":
        need, where = per_device, "on one GPU"
    else:
        need, where = per_device * cell.n_devices, "in this host's memory"
    if need <= memory:
        return None
    held = "a whole copy on each device" if share >= 1 else f"at least 1/{round(1 / share)} of it on a device"
    return (f"out of memory before it starts: {params / 1e9:.1f}B parameters, {held}, need "
            f"{need / 2**30:.1f} GiB {where} for their fp32 values and gradients alone, more than the total "
            f"capacity of {memory / 2**30:.1f} GiB; cut the model (fsdp, tensor, a pipeline) or use more devices")
