"""The host sampler keeps its rate: a timing, so it runs with -m slow (a loaded machine delays the
sampler's thread; tests/distributed/test_telemetry.py checks what it samples)."""

import time

import pytest

from bench.measure.host import HostSource
from bench.measure.telemetry import Sampler


@pytest.mark.slow
@pytest.mark.parametrize("hz", [20, 100])
def test_host_sampler_keeps_its_rate(hz):
    s = Sampler([HostSource()], hz)
    s.start()
    time.sleep(2.0)
    s.stop()
    ts = sorted({r["t"] for r in s.drain()})
    rate = (len(ts) - 1) / (ts[-1] - ts[0])
    assert rate == pytest.approx(hz, rel=0.10)
