"""Training runs: the launcher, its process groups and the worker each rank runs."""
