"""Topology from NVML: the no-NVML path, and the pair/link logic and formatting with fake NVMLs."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from bench.measure.topology import cpu_list, format_matrix, pair_label, topology


class NotSupported(Exception):
    pass


class FakeNVML:
    """The pynvml names topology() uses. ``links[g]`` = list of (active, remote bus id, remote type)."""

    NVML_NVLINK_MAX_LINKS = 18
    NVML_NVLINK_DEVICE_TYPE_SWITCH = 2
    NVML_P2P_CAPS_INDEX_NVLINK = 3
    NVML_P2P_STATUS_OK = 0

    def __init__(self, links: dict[int, list[tuple[bool, str, int]]], n: int, levels: dict | None = None):
        self.links, self.n, self.levels = links, n, levels or {}
        self.shutdown = False

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        self.shutdown = True

    def nvmlDeviceGetCount(self):
        return self.n

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetName(self, h):
        return b"NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetPciInfo(self, h):
        return SimpleNamespace(busId=f"00000000:{0x18 + h:02X}:00.0".encode())

    def nvmlDeviceGetNvLinkState(self, h, link):
        if link >= len(self.links.get(h, [])):
            raise NotSupported
        return int(self.links[h][link][0])

    def nvmlDeviceGetNvLinkRemotePciInfo(self, h, link):
        return SimpleNamespace(busId=self.links[h][link][1])

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, h, link):
        return self.links[h][link][2]

    def nvmlDeviceGetNvLinkVersion(self, h, link):
        return 4

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h):
        return 5

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h):
        return 5

    def nvmlDeviceGetCurrPcieLinkWidth(self, h):
        return 8 if h == 1 else 16  # a GPU that trained at half width

    def nvmlDeviceGetMaxPcieLinkWidth(self, h):
        return 16

    def nvmlDeviceGetNumaNodeId(self, h):
        raise NotSupported  # older drivers

    def nvmlDeviceGetMemoryAffinity(self, h, nodes, scope):
        return [1 if h < 2 else 2]

    def nvmlDeviceGetCpuAffinity(self, h, words):
        return [0xFFFF if h < 2 else 0xFFFF0000, 0]

    def nvmlDeviceGetP2PStatus(self, a, b, cap):
        return 0

    def nvmlDeviceGetTopologyCommonAncestor(self, a, b):
        return self.levels.get((a, b), 50)


def bus(g: int) -> str:
    return f"0000:{0x18 + g:02x}:00.0"  # the 4-digit domain NVML uses for remote ends


def test_without_nvml_says_why():
    class Broken:
        def nvmlInit(self):
            raise RuntimeError("NVML Shared Library Not Found")

    t = topology(Broken())
    assert t == {"available": False, "why": "NVML init failed: RuntimeError: NVML Shared Library Not Found"}


def test_this_machine_without_gpu_does_not_raise():
    t = topology()
    assert set(t) >= {"available"} and (t["available"] or t["why"])


def test_direct_links_counted_per_pair_with_down_links():
    # GPU0-GPU1: 4 links, one of them down; GPU2 only on PCIe
    links = {0: [(True, bus(1), 0)] * 3 + [(False, bus(1), 0)], 1: [(True, bus(0), 0)] * 3 + [(False, bus(0), 0)]}
    nv = FakeNVML(links, 3, levels={(0, 1): 10})
    t = topology(nv)
    assert t["available"] and nv.shutdown
    p01 = next(p for p in t["pairs"] if (p["a"], p["b"]) == (0, 1))
    assert p01["nvlink_links"] == 3 and p01["nvlink_links_down"] == 2 and not p01["via_switch"] and p01["path"] == "PIX"
    p02 = next(p for p in t["pairs"] if (p["a"], p["b"]) == (0, 2))
    assert p02["nvlink_links"] == 0 and pair_label(p02) == "SYS"
    g1 = t["gpus"][1]
    assert g1["pcie"] == {"gen_current": 5, "gen_max": 5, "width_current": 8, "width_max": 16}
    assert g1["numa_node"] is None and g1["cpu_affinity"] == "0-15" and t["gpus"][2]["cpu_affinity"] == "16-31"
    assert g1["numa_affinity"] == "0" and t["gpus"][2]["numa_affinity"] == "1"


def test_nvswitch_pairs():
    links = {g: [(True, "0000:ff:00.0", 2)] * 18 for g in range(4)}
    links[3] = [(True, "0000:ff:00.0", 2)] * 12 + [(False, "0000:ff:00.0", 2)] * 6
    t = topology(FakeNVML(links, 4))
    labels = {(p["a"], p["b"]): pair_label(p) for p in t["pairs"]}
    assert labels[(0, 1)] == "NVSW18" and labels[(2, 3)] == "NVSW12" and len(labels) == 6
    assert all(p["p2p_nvlink_ok"] for p in t["pairs"])
    m = format_matrix(t)
    assert "NVSW18" in m and "gen5x16/gen5x16" in m and m.count("\n") == 4


@pytest.mark.parametrize("words, text", [([0b1011], "0-1,3"), ([0, 1], "64"), ([2**64 - 1, 1], "0-64"),
                                         ([0], ""), (None, None)])
def test_cpu_list(words, text):
    assert cpu_list(words) == text


def test_format_matrix_unavailable():
    assert format_matrix({"available": False, "why": "no driver"}) == "topology unavailable: no driver"
