"""Two nodes over a real network interface: two network namespaces joined by a veth pair, one
`parbench run --nnodes 2` launcher in each, gloo over the veth (GLOO_SOCKET_IFNAME), the rendezvous
at the first namespace's address.

The link is then slowed by a known amount and the measured communication must move by that amount
within 20%: a bandwidth limit (tbf) on both ends, and, where the kernel has ``sch_netem``, a delay.
The cell must say that it crossed nodes over that link, in its row and in the report.

The test creates the namespaces and removes them itself (also when it fails); it is skipped where
it lacks root, ``ip``/``tc`` or network namespaces.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from bench.results import load_run
from tests.distributed.agents import leftovers, run_dir, start, wait_all

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

TAG = f"pb{os.getpid() % 100000}"
NETS = (f"{TAG}n0", f"{TAG}n1")
VETH = (f"{TAG}v0", f"{TAG}v1")  # interface names: at most 15 characters
SUBNET = f"10.{200 + os.getpid() % 50}.{os.getpid() % 250}"
ADDRS = (f"{SUBNET}.1", f"{SUBNET}.2")
PORT = 29400
#: Per step: an all-reduce of 1 MiB (each direction carries the whole buffer) and 4 round trips of a
#: 4-byte message. Few steps, fixed counts: the link's cost, not the statistics, is under test.
PROBE = ["--device", "cpu", "--workloads", "mlp", "--strategies", "tests.helpers:LinkProbe", "--world-sizes", "2",
         "--steps", "5", "--warmup", "2", "--target-ci", "0", "--profile-steps", "2", "--sample-hz", "5",
         "--cell-timeout", "120", "--rdzv-timeout", "60", "--option", "probe_kib=1024", "--option", "pingpongs=4"]
PROBE_BYTES = 1024 * 1024
RATE_BIT_S = 100e6
WIRE = 1514 / 1448  # an Ethernet frame carries 1448 bytes of TCP payload in 1514 (tbf counts frames)
DELAY_S = 0.010
TOL = 0.20


def sh(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(list(cmd), capture_output=True, text=True, check=check, timeout=30)


def teardown() -> None:
    """Remove the namespaces (which removes the veth pair in them) and a veth left in the root
    namespace by a half-finished setup; quiet about what is not there."""
    for ns in NETS:
        sh("ip", "netns", "del", ns, check=False)
    sh("ip", "link", "del", VETH[0], check=False)


@dataclass(frozen=True)
class Link:
    netem: bool  # the kernel has sch_netem (delay); tbf is enough for the bandwidth limit

    def shape(self, qdisc: list[str] | None) -> None:
        """The same root qdisc on both ends (each shapes what leaves its side), or none."""
        for ns, dev in zip(NETS, VETH):
            sh("ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", dev, "root", check=False)
            if qdisc:
                sh("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root", *qdisc)


@pytest.fixture(scope="module")
def link():
    if os.geteuid() != 0:
        pytest.skip("needs root to create network namespaces and a veth pair")
    if not (shutil.which("ip") and shutil.which("tc")):
        pytest.skip("needs iproute2 (ip, tc)")
    teardown()
    try:
        sh("ip", "netns", "add", NETS[0])
        sh("ip", "netns", "add", NETS[1])
        sh("ip", "link", "add", VETH[0], "type", "veth", "peer", "name", VETH[1])
        for ns, dev, addr in zip(NETS, VETH, ADDRS):
            sh("ip", "link", "set", dev, "netns", ns)
            sh("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
            sh("ip", "-n", ns, "link", "set", dev, "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
            # A connection idle between steps would restart from a small window (slow start).
            sh("ip", "netns", "exec", ns, "sysctl", "-q", "net.ipv4.tcp_slow_start_after_idle=0", check=False)
    except (subprocess.CalledProcessError, OSError) as e:
        teardown()
        why = getattr(e, "stderr", "") or str(e)
        pytest.skip(f"cannot create network namespaces and a veth pair here: {' '.join(why.split())[:200]}")
    try:
        probe = sh("ip", "netns", "exec", NETS[0], "tc", "qdisc", "add", "dev", VETH[0], "root", "netem", "delay",
                   "1ms", check=False)
        netem = probe.returncode == 0
        yield Link(netem=netem)
    finally:
        teardown()


def run_pair(tmp: Path, link: Link, qdisc: list[str] | None):
    """One run of the probe with node 0 in the first namespace and node 1 in the second."""
    link.shape(qdisc)
    out = tmp / "out"
    procs = [start(PROBE, node_rank=r, nnodes=2, endpoint=f"{ADDRS[0]}:{PORT}", out=out,
                   prefix=["ip", "netns", "exec", NETS[r]], env={"GLOO_SOCKET_IFNAME": VETH[r]}) for r in (0, 1)]
    nodes = wait_all(procs, 300)
    assert nodes[0].rc == 0, nodes[0].err[-3000:]
    assert nodes[1].rc == 0, nodes[1].err[-3000:]
    assert not leftovers(str(tmp))
    d = run_dir(out)
    cells, _, _ = load_run(d)
    row = cells[cells["strategy"] == "test-linkprobe"].iloc[0]
    assert row["status"] == "ok", row["reason"]
    return row, d


@pytest.fixture(scope="module")
def baseline(link, tmp_path_factory):
    row, _ = run_pair(tmp_path_factory.mktemp("base"), link, None)
    return row


def expected_over(row, *, ifaces=VETH) -> None:
    assert row["nnodes"] == 2 and row["cross_node"]
    assert row["link"] == f"2 nodes over {'/'.join(sorted(ifaces))}", row["link"]
    assert set(row["hosts"].split(",")) == {f"{row['hosts'].split('(')[0]}({a})" for a in ADDRS}, row["hosts"]


def test_bandwidth_limit_moves_the_measured_communication_by_its_cost(link, baseline, tmp_path):
    """tbf at 100 Mbit/s on both ends: each all-reduce of 1 MiB carries 1 MiB each way at once, so
    it must take 1 MiB x 8 / 100 Mbit/s (x frame overhead) = 88 ms longer, within 20%."""
    row, d = run_pair(tmp_path, link, ["tbf", "rate", f"{RATE_BIT_S / 1e6:g}mbit", "burst", "16kb", "latency", "2s"])
    expected = PROBE_BYTES * 8 * WIRE / RATE_BIT_S
    moved = row["comm_time_s"] - baseline["comm_time_s"]
    moved_step = row["step_time_median_s"] - baseline["step_time_median_s"]
    print(f"\nbandwidth limit {RATE_BIT_S / 1e6:g} Mbit/s: injected {expected * 1e3:.1f} ms per all-reduce; "
          f"measured comm time {baseline['comm_time_s'] * 1e3:.1f} -> {row['comm_time_s'] * 1e3:.1f} ms "
          f"(+{moved * 1e3:.1f}), step {baseline['step_time_median_s'] * 1e3:.1f} -> "
          f"{row['step_time_median_s'] * 1e3:.1f} ms (+{moved_step * 1e3:.1f})")
    assert abs(moved - expected) <= TOL * expected, (moved, expected)
    # The step moves too (by less than the all-reduce alone on this VM: the 4 round trips of the
    # same step got faster on the shaped link), which only a looser check can hold to.
    assert moved_step > 0.5 * expected, (moved_step, expected)
    expected_over(row)
    expected_over(baseline)
    from reports import build_report

    html = build_report(d).read_text()
    assert f"2 nodes over {'/'.join(sorted(VETH))}" in html  # the report shows the cell crossing that link


def test_delay_moves_the_round_trips_by_twice_the_delay(link, baseline, tmp_path):
    """netem delay on both ends: each of the 4 round trips of a step crosses the link twice, so the
    step outside the all-reduce (the round trips; the all-reduce's own share is its measured comm
    time) must take 8 x the delay longer, within 20%."""
    if not link.netem:
        pytest.skip("this kernel has no sch_netem (tc qdisc netem: 'Specified qdisc kind is unknown'); the "
                    "bandwidth limit is tested with tbf instead")
    row, _ = run_pair(tmp_path, link, ["netem", "delay", f"{DELAY_S * 1e3:g}ms"])
    expected = 4 * 2 * DELAY_S

    def outside(r):
        return r["step_time_median_s"] - r["comm_time_s"]

    moved = outside(row) - outside(baseline)
    print(f"\ndelay {DELAY_S * 1e3:g} ms each way: injected {expected * 1e3:.1f} ms per step (4 round trips); "
          f"measured {outside(baseline) * 1e3:.1f} -> {outside(row) * 1e3:.1f} ms (+{moved * 1e3:.1f})")
    assert abs(moved - expected) <= TOL * expected, (moved, expected)
    expected_over(row)
