"""The training path's faults, each on the smallest piece that shows it: a full disk under the
compaction of a run's parts, a user workload that never returns while the run is planned, the
start-up limit of a process group apart from the cell limit, a short cell's contention, and children
that die with their parent (even one killed by SIGKILL)."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

from bench.core.config import build_config
from bench.core.errors import UserError
from bench.core.spec import Start
from bench.results.lock import LOCK_NAME
from bench.results.store import RunWriter, read_table
from tests.faults.harness import mounted_tmpfs

REPO = str(Path(__file__).resolve().parents[2])


# --- A full disk under the compaction of a run's parts


def _samples(n: int, seed: int) -> list[dict]:
    """``n`` telemetry rows of random values (they do not compress: a part takes its size on disk)."""
    rng = np.random.default_rng(seed)
    return [{"host": "h", "device": "host", "t": float(t), "metric": "load1", "value": float(v), "node": 0}
            for t, v in zip(rng.random(n), rng.random(n), strict=True)]


def _scratch(run: Path) -> list[str]:
    return [p.name for p in run.glob(".*") if p.name != LOCK_NAME] + [str(p) for p in run.rglob("*.tmp")]


def test_compaction_out_of_space_keeps_every_part_and_no_scratch(tmp_path, monkeypatch):
    run = tmp_path / "run"
    w = RunWriter(run)
    for i in range(3):
        w.append("samples", _samples(100, i))
    before = read_table(run, "samples")
    real = __import__("pyarrow.parquet", fromlist=["write_table"]).write_table

    def full(table, where, *a, **kw):
        if ".compact" in str(where):
            Path(where).write_bytes(b"PAR1 half")  # a half-written merged part, as a full disk leaves it
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(where))
        return real(table, where, *a, **kw)

    monkeypatch.setattr("bench.results.store.pq.write_table", full)
    with pytest.raises(UserError) as e:
        w.compact()
    msg = str(e.value)
    assert str(run / "samples.parquet") in msg and "No space left on device" in msg and "needs about" in msg
    assert "\n" not in msg and f"parbench run --resume {run}" in msg
    assert _scratch(run) == []
    assert len(list((run / "samples.parquet").glob("part-*.parquet"))) == 3
    assert read_table(run, "samples").equals(before)


def test_compaction_checks_the_free_space_before_it_writes(tmp_path, monkeypatch):
    run = tmp_path / "run"
    w = RunWriter(run)
    for i in range(2):
        w.append("samples", _samples(100, i))
    need = sum(p.stat().st_size for p in (run / "samples.parquet").glob("part-*"))
    monkeypatch.setattr("bench.results.store.shutil.disk_usage", lambda _p: shutil._ntuple_diskusage(0, 0, need // 2))
    with pytest.raises(UserError, match="needs about .* free"):
        w.compact()
    assert _scratch(run) == [] and len(read_table(run, "samples")) == 200


def test_a_first_part_that_does_not_fit_leaves_no_empty_table(tmp_path, monkeypatch):
    """An empty cells.parquet folder would read as a table without columns: the run folder unreadable."""
    run = tmp_path / "run"
    w = RunWriter(run)
    w.append("steps", [{"cell_id": 0, "step": 0}])

    def full(_table, where, *a, **kw):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(where))

    monkeypatch.setattr("bench.results.store.pq.write_table", full)
    with pytest.raises(UserError, match=r"cells.parquet/part-000002.parquet \(No space left on device\)"):
        w.append("cells", [{"cell_id": 0, "status": "ok"}])
    with pytest.raises(UserError, match=r"steps.parquet/part-000003.parquet \(No space left on device\)"):
        w.append("steps", [{"cell_id": 0, "step": 1}])
    assert not (run / "cells.parquet").exists() and len(read_table(run, "steps")) == 1 and _scratch(run) == []


@pytest.fixture
def small_disk(tmp_path):
    """A 1 MiB tmpfs at {tmp}/disk (skipped where mounting is not allowed), unmounted afterwards."""
    with mounted_tmpfs(tmp_path / "disk", "1m") as disk:
        yield disk


def test_compaction_on_a_real_full_disk(small_disk):
    run = small_disk / "run"
    w = RunWriter(run)
    for i in range(4):  # about 4 x 160 KiB of parts on 1 MiB: no room for their merged copy
        w.append("samples", _samples(10_000, i))
    before = read_table(run, "samples")
    with pytest.raises(UserError) as e:
        w.compact()
    assert str(run / "samples.parquet") in str(e.value) and "needs about" in str(e.value)
    assert _scratch(run) == []
    assert read_table(run, "samples").equals(before)


# --- A user workload that never returns while the run is planned


def test_a_factory_that_never_returns_is_named(tmp_path):
    import tests.helpers  # noqa: F401 - imported already: the factory's own time is what is measured
    from bench.workloads import planned

    t = time.monotonic()
    with pytest.raises(UserError) as e:
        planned("tests.helpers:factory_hangs", {}, seed=0, global_batch=None, timeout_s=1.0)
    assert time.monotonic() - t < 10
    assert str(e.value) == ("workload 'tests.helpers:factory_hangs': its factory factory_hangs() did not return "
                            "within 1 s; fix it, or give it longer with --workload-timeout SECONDS")


@pytest.mark.parametrize("mod, code, doing", [
    ("slowimport", "import time\ntime.sleep(3600)\n", "the import of 'slowimport'"),
    ("slowbuild", "import time\nfrom bench.workloads import resolve\n"
     "def make(*, seed=0, global_batch=8):\n"
     "    import dataclasses\n"
     "    wl = resolve('mlp', seed=seed, global_batch=global_batch)\n"
     "    return dataclasses.replace(wl, params=None, build=lambda dev: time.sleep(3600))\n",
     "building its model on the meta device"),
])
def test_the_error_says_what_the_workload_was_doing(tmp_path, monkeypatch, mod, code, doing):
    """(Each case has a module of its own: a thread still importing one holds that module's lock.)"""
    from bench.workloads import planned

    (tmp_path / f"{mod}.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(UserError, match=f"workload '{mod}:make': {doing} did not return within 2 s"):
        planned(f"{mod}:make", {}, seed=0, global_batch=None, timeout_s=2.0)


def test_the_workload_timeout_is_a_setting():
    cfg = build_config(toml={"workload_timeout_s": 30}, flags={"startup_timeout_s": 50}, gpus=0)
    assert cfg.measurement.workload_timeout_s == 30.0 and cfg.measurement.startup_timeout_s == 50.0
    with pytest.raises(UserError, match="--workload-timeout 0: use seconds > 0"):
        build_config(toml=None, flags={"workload_timeout_s": 0}, gpus=0)


# --- A process group's start-up has its own limit; the cell limit counts from the cell's start


class FakeLaunch:
    """A torchrun launch that emits ``SCRIPT``'s events at their times (seconds after its start)
    and never exits until killed."""

    SCRIPT: list[tuple[float, object]] = []

    def __init__(self, prefix: str, nproc: int, *, module: str, env: dict, **_rendezvous):
        self.t0, self.sent, self.returncode = time.monotonic(), 0, None
        self.events, self.proc = self, type("P", (), {"pid": 0})()
        self.killed_at: float | None = None

    def poll(self) -> list:
        due = [ev for t, ev in self.SCRIPT[self.sent:] if t <= time.monotonic() - self.t0]
        self.sent += len(due)
        return due

    def exited(self) -> bool:
        return self.returncode is not None

    def kill(self, grace_s: float = 3.0) -> list[str]:
        self.returncode, self.killed_at = -15, time.monotonic() - self.t0
        return []

    def survivors(self) -> list[str]:
        return []

    def crash_reason(self, n_procs: int = 0) -> str:
        return "killed"


def _group_run(tmp_path, monkeypatch, script, repeats=None, **timeouts):
    """The row of one single-device cell whose launch emits a Start at each time of ``script``
    (of the timed repeat, or of ``repeats``' in turn) and never a result."""
    from bench.plan.matrix import group, plan
    from bench.train import group as grp
    from bench.train.context import GroupContext
    from bench.train.run_folder import Telemetry

    cfg = build_config(toml=None, flags={"device": "cpu", "workloads": "mlp", "strategies": "single",
                                         "world_sizes": "1", "sample_hz": 0, **timeouts}, gpus=0)
    g = group(plan(cfg, 0)[0])[0]
    writer = RunWriter(tmp_path / "run")
    (tmp_path / "run" / "work").mkdir()
    launches: list[FakeLaunch] = []
    repeats = repeats or [0] * len(script)
    monkeypatch.setattr(FakeLaunch, "SCRIPT", [(t, Start(cell_id=g.cells[0].cell_id, t=0.0, repeat=r))
                                               for t, r in zip(script, repeats, strict=True)])
    monkeypatch.setattr(grp, "Launch", lambda *a, **kw: launches.append(FakeLaunch(*a, **kw)) or launches[-1])
    ctx = GroupContext(cfg=cfg, writer=writer, work=tmp_path / "run" / "work", telemetry=Telemetry(None, writer))
    grp.GroupRun(g, 0, ctx).run()
    row = read_table(tmp_path / "run", "cells").iloc[0]
    return row, launches[0], json.loads((tmp_path / "run" / "work" / "g0-a1.json").read_text())


def test_a_start_up_past_its_limit_says_so(tmp_path, monkeypatch):
    row, launch, _ = _group_run(tmp_path, monkeypatch, [], startup_timeout_s=0.5, cell_timeout_s=30)
    assert row["status"] == "timeout"
    assert row["reason"].startswith("start-up timeout: the process group did not start within "
                                    "startup_timeout_s=0.5s"), row["reason"]
    assert "cell_timeout_s" not in row["reason"] and 0.5 <= launch.killed_at < 5


def test_a_slow_start_up_is_not_the_cells_time(tmp_path, monkeypatch):
    """The cell starts 1.5 s after the launch, past its own 0.5 s limit: only then does that limit count."""
    row, launch, plan = _group_run(tmp_path, monkeypatch, [1.5], startup_timeout_s=20, cell_timeout_s=0.5)
    assert row["status"] == "timeout"
    assert row["reason"].startswith("no result within cell_timeout_s=0.5s"), row["reason"]
    assert launch.killed_at >= 2.0
    # the ranks' rendezvous (inside the start-up) waits as long as the start-up may take
    assert plan["pg_timeout_s"] == 20


def test_the_rounding_probe_gets_its_own_cell_timeout(tmp_path, monkeypatch):
    """A reference trains its steps a second time for its rounding probe: the limit counts again
    from the probe's start, so a busy machine does not cut the reference for the probe's time."""
    from bench.core.spec import ROUNDING_PASS

    row, launch, _ = _group_run(tmp_path, monkeypatch, [0.1, 1.0], repeats=[0, ROUNDING_PASS],
                                startup_timeout_s=20, cell_timeout_s=1.2)
    assert row["status"] == "timeout" and launch.killed_at >= 2.2, launch.killed_at


def test_a_reference_announces_its_rounding_probe_before_it_runs(monkeypatch):
    """The rank opens the probe with its own Start (which rearms the cell timeout, above), after
    the timed repeat and before the measured event that carries the probe's result."""
    from types import SimpleNamespace

    from bench.core.spec import ROUNDING_PASS, Measured, RankMeasurement
    from bench.plan.matrix import group, plan
    from bench.train import worker

    cfg = build_config(toml=None, flags={"device": "cpu", "workloads": "mlp", "strategies": "single",
                                         "world_sizes": "1", "sample_hz": 0}, gpus=0)
    cell = group(plan(cfg, 0)[0])[0].cells[0]
    seen: list = []
    monkeypatch.setattr(worker, "run_cell",
                        lambda *a, **kw: seen.append("timed") or RankMeasurement(rank=0, times=[0.1]))
    monkeypatch.setattr(worker, "probes", lambda c: True)
    monkeypatch.setattr(worker, "_rounding", lambda *a: seen.append("probe") or 2e-7)
    loop = worker.GroupLoop(plan=SimpleNamespace(deadline_unix=None), rank=0, local_rank=0, leader=True,
                            events=SimpleNamespace(emit=seen.append))
    monkeypatch.setattr(loop, "gather", lambda mine: [mine])
    loop.measure(cell, 0)
    starts = [e.repeat for e in seen if isinstance(e, Start)]
    assert starts == [0, ROUNDING_PASS] and seen.index("probe") == seen.index("timed") + 2, seen
    measured = seen[-1]
    assert isinstance(measured, Measured) and measured.ranks[0].parity_rounding == 2e-7


# --- A cell shorter than the sampling period on a loaded host


def test_a_cell_shorter_than_the_sampling_period_still_sees_the_load():
    from bench.core.spec import CellSpec, Measure, WorkloadFacts
    from bench.results.rows import contention, telemetry_means

    wl = WorkloadFacts(name="mlp", spec="mlp", dims={}, global_batch=8, flops_per_sample=None, params=10,
                       n_blocks=1, n_heads=None, has_tp_plan=False, description="")
    cell = CellSpec(cell_id=0, workload=wl, strategy="ddp", strategy_spec="ddp", backend="gloo", device="cpu",
                    n_devices=2, n_procs=2, devices=(), options={}, labels={}, role="",
                    measure=Measure(steps=3, warmup=1, profile_steps=0, precision="fp32", seed=0))
    # 5 Hz samples around a 20 ms window: none falls inside it
    samples = [{"t": t, "device": "host", "metric": m, "value": v}
               for t in (99.9, 100.1) for m, v in (("other_cpu_cores", 1.6), ("load1", 9.0))]
    samples.append({"t": 130.0, "device": "host", "metric": "load1", "value": 0.0})  # too far to stand for it
    means = telemetry_means(samples, cell, (100.0, 100.02))
    assert means["host_other_cpu_cores"] == pytest.approx(1.6) and means["host_load1"] == pytest.approx(9.0)
    assert "cores busy outside the benchmark" in contention(means, 2)


# --- Children die with their parent, even one killed by SIGKILL


def _gone(pid: int, within_s: float) -> bool:
    end = time.monotonic() + within_s
    while time.monotonic() < end:
        try:
            os.waitpid(pid, os.WNOHANG)  # this process may have adopted it (tests/conftest.py: a subreaper)
        except ChildProcessError:
            pass
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.1)
    return False


def _kill_parent_of(child_code: str, tmp_path: Path) -> int:
    """Starts a parent that starts ``child_code``'s process and prints its pid, SIGKILLs the parent
    and returns the child's pid."""
    (tmp_path / "parent.py").write_text(
        "import subprocess, sys, time\n" + child_code + "\nprint(c.pid, flush=True)\ntime.sleep(600)\n")
    parent = subprocess.Popen([sys.executable, str(tmp_path / "parent.py")], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{REPO}"})
    child = int(parent.stdout.readline())
    time.sleep(0.5)
    parent.kill()
    parent.wait()
    return child


def test_a_child_started_with_parent_death_dies_with_its_parent(tmp_path):
    child = _kill_parent_of("from bench.runtime.lifeline import parent_death\n"
                            "c = subprocess.Popen(['sleep', '600'], preexec_fn=parent_death())", tmp_path)
    assert _gone(child, 2.0), "the child outlived its SIGKILLed parent"


def test_a_rank_dies_with_its_agent_while_it_still_imports(tmp_path):
    (tmp_path / "slow_import.py").write_text("import time\ntime.sleep(600)\n")
    child = _kill_parent_of("c = subprocess.Popen([sys.executable, '-m', 'bench.runtime.lifeline', 'slow_import'])",
                            tmp_path)
    assert _gone(child, 2.0), "the rank outlived its SIGKILLed agent"


def test_a_rank_whose_launcher_is_gone_exits_at_once(tmp_path):
    dead = subprocess.Popen(["true"])
    dead.wait()
    env = {**os.environ, "PARBENCH_LAUNCHER_PID": str(dead.pid)}
    r = subprocess.run([sys.executable, "-m", "bench.runtime.lifeline", "platform"], env=env, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 70 and "the launcher is gone" in r.stderr and r.stdout == ""
    env.pop("PARBENCH_LAUNCHER_PID")
    r = subprocess.run([sys.executable, "-m", "bench.runtime.lifeline", "platform"], env=env, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip()  # the module ran as __main__


def test_a_launch_arms_both_the_agent_and_its_ranks(tmp_path, monkeypatch):
    from bench.runtime import process

    seen: dict = {}

    def popen(cmd, **kw):
        seen.update(cmd=cmd, **kw)
        return type("P", (), {"pid": 12345})()

    monkeypatch.setattr(process.subprocess, "Popen", popen)
    process.Launch(str(tmp_path / "g0-a1"), 2, module="bench.train.worker", env={})
    assert seen["cmd"][-4:] == ["-m", "bench.runtime.lifeline", "bench.train.worker", str(tmp_path / "g0-a1.json")]
    assert callable(seen["preexec_fn"]) and seen["start_new_session"]


def test_a_factory_that_changes_the_working_directory_is_undone(tmp_path, monkeypatch, caplog):
    """A relative --out would land where the factory went, and the last line would name a folder
    that is not there: the planner goes back, and says so."""
    from bench.workloads.registry import planned

    monkeypatch.chdir(tmp_path)
    with caplog.at_level("WARNING", logger="parbench"):
        wl, _ = planned("tests.helpers:factory_chdir", {}, seed=0, global_batch=None, timeout_s=60)
    assert os.getcwd() == str(tmp_path) and wl.global_batch == 8
    assert "its factory changed the working directory to" in caplog.text and str(tmp_path) in caplog.text


def test_processes_a_factory_forks_while_the_run_is_planned_are_ended_and_named(tmp_path, monkeypatch, caplog):
    """A factory that forks (or starts a server) while the run is planned, in the dry run's copy and
    in parbench itself: every child it left is killed, though it ignores SIGTERM, and named; before,
    they outlived parbench run."""
    import psutil

    from bench.workloads.registry import planned

    monkeypatch.setenv("PARBENCH_TEST_PIDS", str(tmp_path))
    with caplog.at_level("WARNING", logger="parbench"):
        wl, _ = planned("tests.helpers:factory_forks", {}, seed=0, global_batch=None, timeout_s=60)
    pids = [int(p.name) for p in tmp_path.iterdir()]
    assert wl.global_batch == 8 and len(pids) == 2, pids  # one from the dry run's copy, one from here
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"
                                              for p in pids):
        time.sleep(0.1)
    alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"]
    assert not alive, alive
    assert caplog.text.count("its factory left") == 2, caplog.text
