"""How the GPUs are wired, from NVML, for meta.json: NVLink links and their state between every
pair of GPUs, PCIe generation and width (current and max), NUMA affinity and CPU affinity.

``topology()`` never raises: without NVML (no driver, no pynvml, a CPU machine) it returns
``{"available": False, "why": ...}``. Individual queries a GPU does not support come back as None.
On NVSwitch machines (H100/H200 SXM) a GPU's links end at a switch, not at a peer: a pair is then
connected ``via_switch`` and the per-pair link count is the smaller of the two GPUs' switch links.
The ``nvml`` argument takes any object with pynvml's names, so tests can pass a fake.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

#: nvmlDeviceGetTopologyCommonAncestor levels -> nvidia-smi topo -m labels
PATH_LABELS = {0: "X", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}


def cpu_list(words: list[int] | None, word_bits: int = 64) -> str | None:
    """CPU affinity bit words (NVML's unsigned longs, lowest CPU first) -> '0-15,32-47'."""
    if words is None:
        return None
    cpus = [w * word_bits + b for w, word in enumerate(words) for b in range(word_bits) if (int(word) >> b) & 1]
    runs: list[list[int]] = []
    for c in cpus:
        if runs and c == runs[-1][1] + 1:
            runs[-1][1] = c
        else:
            runs.append([c, c])
    return ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs)


def pair_label(pair: dict[str, Any]) -> str:
    """nvidia-smi style label of a GPU pair: NV<k> (direct links), NVSW<k> (through NVSwitch) or
    the PCIe path (PIX, PXB, PHB, NODE, SYS)."""
    if pair.get("nvlink_links"):
        return f"NV{pair['nvlink_links']}"
    if pair.get("via_switch"):
        return f"NVSW{pair.get('switch_links') or ''}"
    return pair.get("path") or "?"


def format_matrix(topo: dict[str, Any]) -> str:
    """The pair labels as a matrix, plus PCIe and NUMA per GPU (for logs and the report)."""
    if not topo.get("available"):
        return f"topology unavailable: {topo.get('why')}"
    gpus = topo["gpus"]
    n = len(gpus)
    cell = {(p["a"], p["b"]): pair_label(p) for p in topo["pairs"]}
    cell.update({(b, a): v for (a, b), v in list(cell.items())})
    head = "      " + "".join(f"{'GPU' + str(j):>8}" for j in range(n)) + "   PCIe cur/max      NUMA  CPUs"
    lines = [head]
    for g in gpus:
        i, pcie = g["index"], g.get("pcie") or {}
        row = "".join(f"{('X' if i == j else cell.get((i, j), '?')):>8}" for j in range(n))
        link = (f"gen{pcie.get('gen_current')}x{pcie.get('width_current')}/"
                f"gen{pcie.get('gen_max')}x{pcie.get('width_max')}")
        numa = g.get("numa_affinity") or g.get("numa_node")
        lines.append(f"GPU{i:<3}{row}   {link:<17} {str(numa):<5} {g.get('cpu_affinity')}")
    return "\n".join(lines)


def _try(fn: Callable[..., Any], *args: Any) -> Any:
    """One NVML query; None where this GPU or driver does not support it."""
    try:
        return fn(*args)
    except Exception:  # noqa: BLE001 - NVMLError_NotSupported and friends: record as unknown
        return None


def _bus_id(pci: Any) -> str | None:
    if pci is None:
        return None
    bus = getattr(pci, "busId", None) or getattr(pci, "busIdLegacy", None)
    if isinstance(bus, bytes):
        bus = bus.decode()
    # drop the PCI domain: NVML writes it with 8 digits in one place and 4 in another
    return ":".join(str(bus).lower().split(":")[-2:]) if bus else None


def _gpu(nv: Any, i: int, handle: Any, cpu_words: int) -> dict[str, Any]:
    """Everything about one GPU except its pairs."""
    max_links = int(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18))
    links = []
    for link in range(max_links):
        state = _try(nv.nvmlDeviceGetNvLinkState, handle, link)
        if state is None:
            continue  # link not present on this GPU
        links.append({"link": link, "active": bool(state),
                      "remote_bus_id": _bus_id(_try(nv.nvmlDeviceGetNvLinkRemotePciInfo, handle, link)),
                      "remote_type": _try(getattr(nv, "nvmlDeviceGetNvLinkRemoteDeviceType", lambda *a: None),
                                          handle, link),
                      "version": _try(nv.nvmlDeviceGetNvLinkVersion, handle, link)})
    words = _try(nv.nvmlDeviceGetCpuAffinity, handle, cpu_words)
    # the NUMA nodes near the GPU (nvidia-smi's "NUMA Affinity"); numa_node is the GPU's own node
    # id, which only GPUs with coherent memory (Grace Hopper) have
    nodes = _try(getattr(nv, "nvmlDeviceGetMemoryAffinity", lambda *a: None), handle, 1,
                 getattr(nv, "NVML_AFFINITY_SCOPE_NODE", 0))
    name = _try(nv.nvmlDeviceGetName, handle)
    return {
        "index": i, "name": name.decode() if isinstance(name, bytes) else name,
        "bus_id": _bus_id(_try(nv.nvmlDeviceGetPciInfo, handle)),
        "pcie": {"gen_current": _try(nv.nvmlDeviceGetCurrPcieLinkGeneration, handle),
                 "gen_max": _try(nv.nvmlDeviceGetMaxPcieLinkGeneration, handle),
                 "width_current": _try(nv.nvmlDeviceGetCurrPcieLinkWidth, handle),
                 "width_max": _try(nv.nvmlDeviceGetMaxPcieLinkWidth, handle)},
        "numa_node": _try(getattr(nv, "nvmlDeviceGetNumaNodeId", lambda h: None), handle),
        "numa_affinity": cpu_list(list(nodes) if nodes is not None else None),
        "cpu_affinity": cpu_list(list(words) if words is not None else None),
        "nvlink": links,
    }


def _pairs(nv: Any, gpus: list[dict[str, Any]], handles: list[Any]) -> list[dict[str, Any]]:
    """One entry per unordered GPU pair: direct links, switch links, P2P status, PCIe path."""
    switch_type = getattr(nv, "NVML_NVLINK_DEVICE_TYPE_SWITCH", 2)
    by_bus = {g["bus_id"]: g["index"] for g in gpus if g["bus_id"]}
    out = []
    for a in range(len(gpus)):
        for b in range(a + 1, len(gpus)):
            la, lb = gpus[a]["nvlink"], gpus[b]["nvlink"]
            direct = [x for x in la if x["active"] and by_bus.get(x["remote_bus_id"]) == b]
            down = [x for x in la + lb if not x["active"] and by_bus.get(x["remote_bus_id"]) in (a, b)]
            sw = [sum(1 for x in lst if x["active"] and x["remote_type"] == switch_type) for lst in (la, lb)]
            p2p = _try(nv.nvmlDeviceGetP2PStatus, handles[a], handles[b],
                       getattr(nv, "NVML_P2P_CAPS_INDEX_NVLINK", 3)) if hasattr(nv, "nvmlDeviceGetP2PStatus") else None
            level = _try(nv.nvmlDeviceGetTopologyCommonAncestor, handles[a], handles[b])
            out.append({"a": a, "b": b, "nvlink_links": len(direct), "nvlink_links_down": len(down),
                        "via_switch": min(sw) > 0, "switch_links": min(sw),
                        "p2p_nvlink_ok": None if p2p is None else p2p == getattr(nv, "NVML_P2P_STATUS_OK", 0),
                        "path": PATH_LABELS.get(level, None if level is None else str(level))})
    return out


def topology(nvml: Any = None, cpu_words: int = 4) -> dict[str, Any]:
    """The machine's GPU topology from NVML, or ``{"available": False, "why": ...}``."""
    if nvml is None:
        try:
            import pynvml as nvml  # nvidia-ml-py
        except ImportError as e:
            return {"available": False, "why": f"pynvml not importable ({e}); pip install nvidia-ml-py"}
    try:
        nvml.nvmlInit()
    except Exception as e:  # noqa: BLE001 - no driver on CPU machines
        return {"available": False, "why": f"NVML init failed: {type(e).__name__}: {e}"}
    try:
        count = int(nvml.nvmlDeviceGetCount())
        handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        gpus = [_gpu(nvml, i, h, cpu_words) for i, h in enumerate(handles)]
        topo = {"available": True, "gpu_count": count, "gpus": gpus, "pairs": _pairs(nvml, gpus, handles)}
        topo["matrix"] = format_matrix(topo)
        return topo
    except Exception as e:  # noqa: BLE001 - a half-broken driver: say so, never fail the run
        return {"available": False, "why": f"NVML query failed: {type(e).__name__}: {e}"}
    finally:
        _try(nvml.nvmlShutdown)


if __name__ == "__main__":
    print(format_matrix(topology()))
