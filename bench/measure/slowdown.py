"""NVML clock-event reasons the samplers keep and the rows read.

The software power cap is how a fully loaded GPU holds its power limit: a compute-bound cell sits
there most of the time and stays steady, so it is reported beside the cell, not as contention.
Thermal slowdowns, the hardware slowdown and the power brake mean something outside the cell is
slowing it.
"""

POWER_CAP = 0x4
THROTTLED = 0x8 | 0x20 | 0x40 | 0x80
