"""Decisions from a cells table: which strategy to use per workload, backend and world size
(:mod:`bench.decide.recommend`), by the rules of :mod:`bench.decide.rules`, each a value of
:mod:`bench.decide.decision` that carries its evidence and names the cells an open decision still
needs measured again. The run's adaptive repeats and the report read the same decisions; the
report's words for them are :mod:`reports.words`."""
