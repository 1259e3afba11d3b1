import os

# Keep the CPU tests from oversubscribing a 2-core CI machine.
os.environ.setdefault("OMP_NUM_THREADS", "1")
