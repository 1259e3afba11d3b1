import os
import signal
import sys
import time

import psutil
import pytest

# Keep the CPU tests from oversubscribing a 2-core CI machine.
os.environ.setdefault("OMP_NUM_THREADS", "1")

#: Processes that legitimately outlive one test module: Python's multiprocessing helpers, started
#: once per interpreter and stopped at its exit.
SESSION_HELPERS = ("multiprocessing.resource_tracker", "multiprocessing.forkserver")
#: How long a module's processes may take to exit after its last test before they count as left.
LEFT_GRACE_S = float(os.environ.get("PARBENCH_TEST_LEFT_GRACE_S", "10"))


def pytest_configure(config):
    # Orphans come home: a process whose parent died (a rank whose torchrun agent a fault test
    # killed) is re-parented to this process instead of init, so the check below can find it. A
    # process left running holds the suite's stdout open, and CI waits on that until its timeout.
    from bench.runtime.process import become_subreaper

    become_subreaper()


def _running_descendants() -> dict[int, tuple[psutil.Process, str]]:
    out = {}
    for p in psutil.Process().children(recursive=True):
        try:
            if p.status() == psutil.STATUS_ZOMBIE:
                continue
            cmd = " ".join(p.cmdline()) or p.name()
        except psutil.Error:
            continue
        if not any(h in cmd for h in SESSION_HELPERS):
            out[p.pid] = (p, cmd)
    return out


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed distributed test names the rank logs its runs wrote (each rank's stdout and stderr,
    in the run folder's work/), instead of anyone pasting them into the terminal."""
    outcome = yield
    rep = outcome.get_result()
    if not rep.failed or item.get_closest_marker("distributed") is None:
        return
    try:
        base = item.config._tmp_path_factory.getbasetemp()
    except Exception:  # noqa: BLE001 - no temporary folder, nothing to name
        return
    since = getattr(item.module, "_parbench_started", 0.0)
    logs = sorted(str(p) for p in base.rglob("*.log") if "work" in p.parts and p.stat().st_mtime >= since)
    if logs:
        rep.sections.append(("rank logs", "\n".join(logs[-20:])))


@pytest.fixture(scope="module", autouse=True)
def no_process_left_behind(request):
    """Every process a test module starts has exited by the end of the module (its module-scoped
    fixtures included: an autouse fixture is set up first and torn down last). One still running
    LEFT_GRACE_S later is killed with its children and fails the module, named by its command line."""
    before = set(_running_descendants())
    request.module._parbench_started = time.time()  # the rank logs a failure names are this module's
    yield
    deadline = time.monotonic() + LEFT_GRACE_S
    while True:
        left = {pid: v for pid, v in _running_descendants().items() if pid not in before}
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    if not left:
        return
    procs = [p for p, _ in left.values()]
    for p in procs:
        try:
            p.send_signal(signal.SIGKILL)
        except psutil.Error:
            pass
    psutil.wait_procs(procs, timeout=5)
    names = "; ".join(f"pid {pid}: {cmd[:160]}" for pid, (_, cmd) in sorted(left.items()))
    print(f"\n{request.module.__name__}: {len(left)} process(es) left running, killed: {names}", file=sys.stderr)
    pytest.fail(f"{request.module.__name__} left {len(left)} process(es) running {LEFT_GRACE_S:.0f} s after its "
                f"last test (killed): {names}", pytrace=False)
