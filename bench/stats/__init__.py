"""Every estimator and statistical test of parbench, by topic (numbers in, numbers out; the rules
that turn them into verdicts and row fields live with their callers):

* :mod:`bench.stats.steps` - a cell's step-time summary: median and its bootstrap interval over
  repeats, p95, noise flags (CV, repeat spread, bimodality, outliers), the slow rank;
* :mod:`bench.stats.intervals` - the order-statistic interval of the median (no scipy: the ranks
  import it);
* :mod:`bench.stats.ranktests` - two-sample shift tests (Hodges-Lehmann shift with its
  Mann-Whitney interval, the run-to-run t test) and the sample sizes that resolve a threshold;
* :mod:`bench.stats.changepoints` - change points of a series (optimal L1 partition), quartiles;
* :mod:`bench.stats.serving` - latency percentiles that refuse too few samples, Little's law,
  imbalance;
* :mod:`bench.stats.parity` - the parity check's tolerances and its loss distance (numpy only: the
  ranks import it).

This package imports nothing itself, so importing one topic loads only that topic.
"""
