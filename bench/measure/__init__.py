"""Measuring a run: step timing, telemetry samplers, the profiler trace's breakdown and the machine's fingerprint."""
