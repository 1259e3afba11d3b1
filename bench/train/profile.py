"""A cell's profiled steps on one rank: the compute/communication breakdown, the communication
records and the per-step communication the distribution check reads as evidence.

Profiled steps run after a cell's first timed repeat (:func:`profile_into`), or, when deferred
(``profile_at`` "end"), in the group's profile pass after every timed step (:func:`profile_cell`).
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile, record_function, schedule

from bench.core import backends
from bench.core.metrics import BREAKDOWN_GAP_MAX
from bench.core.spec import CellSpec, GroupPlan, RankMeasurement
from bench.measure.timing import StepTimer
from bench.measure.trace import alone, analyze_trace, comm_volume, has_gpu_events, has_markers
from bench.train.cell import PLACE, build, release
from bench.train.events import one_line
from bench.train.timed import CHUNK, past_deadline


@dataclass(frozen=True)
class Built:
    """A built cell as its profiled passes run it: its step, the batches it steps through, the cell,
    the device and the cell's backend."""

    step: Any
    batches: Sequence[Any]
    cell: CellSpec
    device: torch.device
    backend: backends.Backend

    def run(self, k: int) -> None:
        """Step ``k`` of a pass, on the batch the timed steps' order gives it after the warm-up."""
        m = self.cell.measure
        self.step.run(self.batches[(m.warmup + k % m.steps) % len(self.batches)])


def activities(device: torch.device, backend: backends.Backend, *, timing: bool) -> list[ProfilerActivity]:
    """What a profiled pass records. The timing pass records the least that still shows the step's
    communication: GPU activity alone where the backend communicates in kernels (NCCL), since host
    events cost the launching thread time on every op and a launch-bound step stretches with them
    (on 4 H100s, DDP steps profiled with host events ran up to 2.3x their timed median); the host
    side too where communication is host spans (Gloo). The records pass records the host side
    only: c10d's ``record_param_comms`` (op, bytes, group size) and the backend's spans."""
    if device.type != "cuda" or not timing:
        return [ProfilerActivity.CPU]
    if backend.comm_in_kernels():
        return [ProfilerActivity.CUDA]
    return [ProfilerActivity.CPU, ProfilerActivity.CUDA]


def profile_steps(b: Built, trace_path: Path | None, *, n: int, acts: list[ProfilerActivity], shapes: bool = False,
                  drain: bool | None = None) -> dict[str, Any]:
    """Run ``n`` steps under torch.profiler recording ``acts`` (with the ops' input shapes when
    ``shapes``), after one profiled step whose events are discarded; returns the Chrome trace of
    the ``n`` as a dict (the trace file is removed afterwards unless ``trace_path`` keeps it).

    On CUDA a marker kernel (bench.measure.trace.MARKER) brackets each step on the step's stream,
    where the timed steps' CUDA events go: the breakdown describes the steps between their markers.
    A pass that records GPU activity only runs its steps back to back after the warm-up step, as
    timed steps do; any other pass (or one told ``drain``) enters its ``n`` steps with the ranks
    together and the device drained, so that its window (first to last event) holds those steps
    and nothing before."""
    device = b.device
    cuda = device.type == "cuda"
    mark = (lambda: torch.cuda._sleep(0)) if cuda else (lambda: None)
    if drain is None:
        drain = not (cuda and acts == [ProfilerActivity.CUDA])
    if cuda:
        torch.cuda.synchronize(device)
    dist.barrier()
    # One step under the profiler first, its events discarded (the schedule's warm-up): the
    # profiler's own start (CUPTI's activation, its first buffers) lands there, not on the steps
    # the breakdown describes.
    plan = schedule(wait=0, warmup=1, active=n, repeat=1)
    with profile(activities=acts, record_shapes=shapes, schedule=plan) as prof:
        for k in range(n + 1):
            with record_function("parbench_step"):
                mark()
                b.run(k)
                mark()
            if k == 0 and drain:
                if cuda:
                    torch.cuda.synchronize(device)
                dist.barrier()
                if cuda:
                    torch.cuda.synchronize(device)
            elif k == n and cuda:
                torch.cuda.synchronize(device)
            prof.step()
    keep = trace_path is not None
    path = trace_path or Path(tempfile.mkstemp(suffix=".json", prefix="parbench-trace-")[1])
    try:
        prof.export_chrome_trace(str(path))
        return json.loads(path.read_text())
    finally:
        if not keep:
            path.unlink(missing_ok=True)


def unprofiled_steps(b: Built, n: int) -> float:
    """The median of ``n`` steps run as the profiled ones are (the same batches, back to back after
    the ranks meet) but without the profiler, timed as the timed steps are (CUDA events on the
    step's stream; the host clock on CPU). They settle the rebuilt cell further before anything is
    profiled; far from the timed median, the pass was still settling when they ran, or the cell
    built again steps at another speed (see :func:`profile_cell`)."""
    timer = StepTimer(b.device)
    if b.device.type == "cuda":
        torch.cuda.synchronize(b.device)
    dist.barrier()
    for k in range(n):
        timer.time(lambda k=k: b.run(k + 1))
    return statistics.median(timer.times())


#: Timing passes at most on one build: a pass whose profiled step is further than
#: BREAKDOWN_GAP_MAX from the timed median runs again, and the closest pass is kept. On 4 H200s a
#: plain FSDP2 step held within 2% of 86 ms over 5 unprofiled blocks and ran 81-114 ms over 5
#: GPU-profiled ones (tools/baselines/profiler_step_cost.py): some passes land near the step,
#: others do not, and each costs a few steps.
PROFILE_PASSES = 5
#: Builds at most for one deferred profile pass (see :func:`profile_cell`).
PROFILE_BUILDS = 3
#: Unprofiled steps at least that judge a build against the timed median before it is profiled:
#: one slow step moves the median of 2 (the default profiled steps) past BREAKDOWN_GAP_MAX on a
#: stable cell, and a build judged off is built again.
CHECK_STEPS = CHUNK

#: The closest timing pass so far: (its |gap| from the timed median, its build's unprofiled
#: median, its Chrome trace).
Kept = tuple[float, float, dict[str, Any]]


def timing_pass(b: Built, n: int, plain: float | None = None) -> tuple[float, dict[str, Any]]:
    """One timing pass: ``n`` unprofiled steps (their median; ``plain`` when the caller has just
    timed them), then ``n`` steps profiled with :func:`activities` (the Chrome trace)."""
    if plain is None:
        plain = unprofiled_steps(b, n)
    acts = activities(b.device, b.backend, timing=True)
    timing = profile_steps(b, None, n=n, acts=acts)
    if acts == [ProfilerActivity.CUDA] and not has_gpu_events(timing):
        # Some builds record no kernels in a GPU-only session: the host side as well, then.
        both = [ProfilerActivity.CPU, ProfilerActivity.CUDA]
        timing = profile_steps(b, None, n=n, acts=both)
    elif acts == [ProfilerActivity.CUDA] and not has_markers(timing, n):
        # Without its step markers a back-to-back trace has no steps to cut (the warm-up's last
        # kernels run into the first): again from a drained device, read first to last kernel.
        timing = profile_steps(b, None, n=n, acts=acts, drain=True)
    return plain, timing


def gap_over_ranks(span: float | None, target_s: float | None) -> float | None:
    """The slowest rank's profiled step over the slowest rank's timed median, less one (what the
    cell's ``breakdown_gap`` will be); the same value on every rank. None where a rank has neither."""
    pairs: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(pairs, (span, target_s))
    if any(p is None or p[0] is None or not p[1] for p in pairs):
        return None
    return max(p[0] for p in pairs) / max(p[1] for p in pairs) - 1


def close(kept: Kept | None) -> bool:
    """The kept pass describes the timed step: its profiled step within BREAKDOWN_GAP_MAX of it."""
    return kept is not None and kept[0] <= BREAKDOWN_GAP_MAX


def timing_passes(b: Built, plan: GroupPlan, n: int, target_s: float | None, kept: Kept | None = None,
                  plain: float | None = None) -> tuple[Kept | None, int]:
    """Timing passes on this build until one is :func:`close` (or PROFILE_PASSES ran, or the run's
    deadline passed after the first): the closest of them and of ``kept`` (a former build's), and
    how many ran. ``plain``: the build's unprofiled median, just measured, which the first pass
    uses instead of timing its own. Without ``target_s``, or where a rank has no profiled step,
    one pass."""
    passes = 0
    while passes < PROFILE_PASSES and not (passes and (close(kept) or past_deadline(plan.deadline_unix))):
        plain, timing = timing_pass(b, n, plain if not passes else None)
        passes += 1
        span = analyze_trace(timing, b.device.type, n, b.backend)[0].get("profiled_step_s")
        gap = gap_over_ranks(span, target_s)
        if gap is None:  # no timed median, or a rank without a profiled step: nothing to hold it to
            return kept or (0.0, plain, timing), passes
        if kept is None or abs(gap) < kept[0]:
            kept = (abs(gap), plain, timing)
    return kept, passes


def profile_into(out: RankMeasurement, b: Built, plan: GroupPlan, *, n: int, full: bool, target_s: float | None = None,
                 kept: Kept | None = None, passes: int = 0) -> None:
    """``n`` profiled steps into ``out``: the communication per step (the distribution check's
    evidence) always; with ``full``, the breakdown and the collectives' durations from the closest
    of :func:`timing_passes` (``kept`` and ``passes``: those a caller ran already), then the
    records pass (kept under the run's traces when asked, the kept timing pass's trace beside it
    as ``-gpu.json``).

    ``target_s`` is the cell's timed median (the same on every rank). The profiler can slow a step,
    more on some passes than on others (a plain FSDP2 step at 4 GPUs: 85-87 ms unprofiled, 81-114 ms
    over GPU-profiled blocks, ``tools/baselines/profiler_step_cost.py``), and a breakdown of a
    slower step describes another step: passes run again while the closest is further than
    BREAKDOWN_GAP_MAX from the timed median (over ranks, as the cell's ``breakdown_gap``), and
    ``profile_passes`` says how many ran. Without a timed median (a relaunch that runs only the
    group's profile passes), one pass; past the run's deadline, no further one."""
    cell, device, backend = b.cell, b.device, b.backend
    base = Path(plan.trace_dir) / f"cell{cell.cell_id}-rank{out.rank}" if plan.trace_dir and full else None
    # Input shapes cost the launching thread time on every op; only a host-side backend's byte
    # counts need them, a kernel backend's come with its own records (record_param_comms).
    shapes = not backend.comm_in_kernels()
    if full and not passes:
        kept, passes = timing_passes(b, plan, n, target_s)
    records = profile_steps(b, base and base.with_suffix(".json"), n=n, acts=activities(device, backend, timing=False),
                            shapes=shapes)
    if full and kept is not None:
        _, plain, timing = kept
        if base is not None:
            base.with_name(base.name + "-gpu.json").write_text(json.dumps(timing))
        out.breakdown, out.comm = analyze_trace(timing, device.type, n, backend, records=records)
        if out.breakdown:
            out.breakdown.update(unprofiled_step_s=plain, profile_passes=passes)
    calls, nbytes = comm_volume(records, backend)
    if cell.n_devices == 1:
        # A collective over one rank on one device moves nothing (DDP still calls all_reduce): no
        # communication. One process over several devices (DataParallel, a layer split) does move
        # data between them, and keeps it.
        out.comm, calls, nbytes = [], 0, 0.0
        if out.breakdown:
            out.breakdown = alone(out.breakdown)
    out.comm_calls_per_step, out.comm_bytes_per_step = calls / n, nbytes / n


def profile_cell(cell: CellSpec, plan: GroupPlan, local_rank: int, warmup: int,
                 target_s: float | None = None) -> RankMeasurement:
    """A cell's deferred profile pass: build it again, run ``warmup`` steps (what its first timed
    repeat needed to settle), then its profiled steps (``target_s``: the timed median they are
    held to, see :func:`profile_into`). Returns this rank's breakdown, communication records and
    the pass's time (builds included) as ``profile_s`` (never raises).

    Some cells step at another speed from one build to the next (on 4 H200s, FSDP timed at 75 ms
    in its repeat's build ran 88 ms unprofiled in its pass's build), and no pass on such a build
    can describe the timed step. A build whose unprofiled steps (CHECK_STEPS at least, their
    median the first pass's) are further than BREAKDOWN_GAP_MAX from ``target_s`` (over ranks), or
    whose timing passes all were, is built again, up to PROFILE_BUILDS builds in all and none after
    the run's deadline; the closest timing pass over the builds is kept, the records come from the
    last build (the same collectives in the same order on every build), and ``profile_builds``
    says how many builds ran.

    Why deferred: a profiler session with GPU activity leaves the process slower at launching work
    even with CUPTI torn down (x1.09 on a launch-bound loop, ``tools/baselines/profiler_aftereffect.py``),
    and the harness's ranks go on to time the group's later cells; on 2 H100s a host-bound tensor-sp
    cell timed after the reference cell's GPU-profiled steps moves 16-26% from round to round within a
    call, and holds within 0.2% without them, while its plain loop beside it moves 8-10%
    (docs/RESULTS.md)."""
    out = RankMeasurement(rank=dist.get_rank(), **PLACE)
    step = None
    tp = time.perf_counter()
    n = cell.measure.profile_steps
    be = backends.get(cell.backend)
    kept: Kept | None = None
    passes = 0
    try:
        for builds in range(1, PROFILE_BUILDS + 1):
            _, device, batches, step, _ = build(cell, local_rank, out)
            for k in range(max(warmup, 1)):
                step.run(batches[k % len(batches)])
            b = Built(step, batches, cell, device, be)
            last = target_s is None or builds == PROFILE_BUILDS
            plain = None
            if not last:
                plain = unprofiled_steps(b, max(n, CHECK_STEPS))
                gap = gap_over_ranks(plain, target_s)
                last = gap is None or past_deadline(plan.deadline_unix)
                if not last and abs(gap) > BREAKDOWN_GAP_MAX:
                    step = batches = b = None  # this build steps at another speed: build it again
                    release(cell)
                    continue
            kept, more = timing_passes(b, plan, n, target_s, kept, plain)
            passes += more
            if last or close(kept) or past_deadline(plan.deadline_unix):
                break
            step = batches = b = None  # every pass on this build was off: build it again
            release(cell)
        profile_into(out, b, plan, n=n, full=True, target_s=target_s, kept=kept, passes=passes)
        if out.breakdown:
            out.breakdown["profile_builds"] = builds
    except Exception as e:  # noqa: BLE001 - a failed pass leaves the cell's timing alone
        out.status, out.reason = "failed", one_line(e)
        if os.environ.get("PARBENCH_DEBUG"):
            traceback.print_exc()
    finally:
        step = b = None
        release(cell)
    out.profile_s = time.perf_counter() - tp
    return out
