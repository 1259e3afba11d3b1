"""Starting and stopping rank processes: the one way the harness runs torchrun and its other children.

:mod:`.process` builds a launch's command and environment and follows its process tree (the agent,
its ranks, any orphan that names the launch's plan file), so that a timeout, a signal or an
exception kills all of it; :mod:`.events` reads the ranks' event files; :mod:`.crash` says why a
launch died; :mod:`.signals` notes a stop signal and raises it at a point where nothing is lost.
:class:`.process.Launch` bundles one launch of a worker module for a plan file, and
:func:`.process.run_tree` runs any other command with its whole tree; :class:`.spawned.Spawned` is a
group of long-lived multiprocessing (spawn) processes, such as serving's pool.
"""
