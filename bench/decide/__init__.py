"""Decisions from a cells table: which strategy to use per workload, backend and world size
(:mod:`bench.decide.recommend`), by the rules of :mod:`bench.decide.rules`, and which cells a
decision still open needs measured again (:mod:`bench.decide.open`). The run's adaptive repeats and
the report read the same decisions."""
