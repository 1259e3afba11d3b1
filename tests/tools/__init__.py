"""Tests of the developer tools in tools/ (plain reference loops, the A/B and pooling tools, calibration)."""
