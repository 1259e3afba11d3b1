"""The activation probe: one forward and backward of a workload's own model on one device at small
micro-batches, the memory each took above the step's start, for the memory model's activation term
(:class:`bench.core.memory.Probe`).

On a GPU the probe reads CUDA's allocator (the peak of allocated bytes), the reservation it grew
to and what NVML sees the process use beyond it (the CUDA context); on a CPU it counts the bytes of
the tensors alive at each operation (:class:`LiveBytes`), there being no allocator to ask. It runs
in a child process of its own (``python -m bench.plan.probe``), before any rank starts: the planning
process never creates a CUDA context, and a model that runs out of memory, crashes or hangs in the
probe costs the run its activation term (the prediction then says it is a lower bound), not the run.

Each probe builds the model with the cell's activation checkpointing and precision (bf16 autocast),
eager: a compiled model's activations are smaller than the eager ones, so under ``--compile on``
the term is an upper bound (the report says which).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass

from bench.core.memory import Probe


@dataclass(frozen=True, kw_only=True)
class Ask:
    """One probe: the workload (spec and dimensions), seed, precision, checkpointing, device, and the
    micro-batches to probe."""

    spec: str
    dims: dict
    seed: int
    precision: str
    ac: str
    device: str
    batches: tuple[int, ...]

    def key(self) -> tuple:
        return (self.spec, tuple(sorted(self.dims.items())), self.precision, self.ac, self.device)


#: Seconds one probe process may take for all its probes before it is stopped (the run goes on
#: without activation terms).
PROBE_TIMEOUT_S = 300.0


def probe_batches(per_device: list[int]) -> tuple[int, ...]:
    """The micro-batches to probe for cells of these per-device micro-batches: a quarter and a half
    of the largest (two points a factor of two apart, in the regime of the cells' own batches: the
    part of a step that peaks grows faster with the batch than the one that peaks at a small
    batch), at least 1 and 2; the probe halves them while they run out of memory."""
    top = max(per_device) if per_device else 1
    if top <= 1:
        return (1,)
    low = max(1, top // 4)
    return (low, max(2 * low, top // 2))


def run_probes(asks: list[Ask], timeout_s: float = PROBE_TIMEOUT_S) -> dict[tuple, Probe | str]:
    """Each ask's :class:`Probe`, or the reason it has none, from one child process."""
    if not asks:
        return {}
    env = dict(os.environ)
    env.setdefault("PYTHONUNBUFFERED", "1")
    try:
        done = subprocess.run([sys.executable, "-m", "bench.plan.probe"], input=json.dumps([asdict(a) for a in asks]),
                              capture_output=True, text=True, timeout=timeout_s, env=env)
        stdout, missing = done.stdout, None
    except subprocess.TimeoutExpired as e:  # the probes that finished in time still count
        stdout = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        missing = f"the activation probe ran out of its {timeout_s:.0f} s"
    except OSError as e:
        return {a.key(): f"the activation probe could not start: {e}" for a in asks}
    answers = _answers(stdout)
    out: dict[tuple, Probe | str] = {}
    for i, a in enumerate(asks):
        got = answers.get(i)
        if got is None:
            tail = missing or (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1][:200]
            out[a.key()] = tail if missing else f"the activation probe ended early ({tail})"
        elif "reason" in got:
            out[a.key()] = got["reason"]
        else:
            out[a.key()] = Probe(batches=tuple(got["batches"]), peaks=tuple(got["peaks"]),
                                 activation_peaks=tuple(got["activation_peaks"]),
                                 context=got.get("context"), how=got["how"])
    return out


def _answers(stdout: str) -> dict[int, dict]:
    out = {}
    for line in stdout.splitlines():
        if line.startswith("PROBE "):
            try:
                got = json.loads(line[6:])
                out[int(got["index"])] = got
            except (ValueError, KeyError, TypeError):
                continue
    return out


# -- the child ---------------------------------------------------------------------------------------

def _live_bytes_mode():
    import torch
    from torch.multiprocessing.reductions import StorageWeakRef
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    class LiveBytes(TorchDispatchMode):
        """Counts the bytes of the tensor storages created under it that are still alive after each
        operation, and the peak of that count."""

        def __init__(self):
            super().__init__()
            self.live: dict[int, tuple[StorageWeakRef, int]] = {}
            self.now = self.peak = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for key in [k for k, (ref, _) in self.live.items() if ref.expired()]:
                self.now -= self.live.pop(key)[1]
            for t in tree_leaves(out):
                if isinstance(t, torch.Tensor) and t.device.type != "meta":
                    s = t.untyped_storage()
                    key = s.data_ptr()
                    if key and key not in self.live:
                        self.live[key] = (StorageWeakRef(s), s.nbytes())
                        self.now += s.nbytes()
            self.peak = max(self.peak, self.now)
            return out

    return LiveBytes


def _one(ask: Ask) -> dict:
    """The probe of ``ask``; while its batches run out of memory, again at half of them."""
    import torch

    device = torch.device("cuda", 0) if ask.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        _like_a_rank(device)
    batches = ask.batches
    while True:
        try:
            return _probe(ask, batches, device)
        except torch.OutOfMemoryError:
            if batches[0] <= 1:
                raise
            batches = tuple(max(1, b // 2) for b in batches)
            torch.cuda.empty_cache()


def _probe(ask: Ask, batches: tuple[int, ...], device) -> dict:
    """The probe of ``ask`` at ``batches``: the model built once, each batch run on it."""
    import torch

    from bench.workloads import resolve
    from strategies.training import checkpoint_blocks, inner_blocks

    wl = resolve(ask.spec, seed=ask.seed, global_batch=batches[0], **ask.dims)
    model = wl.build(device)
    checkpoint_blocks(inner_blocks(wl, model), ask.ac)
    peaks, held = [], []
    context = None
    for b in batches:
        data = resolve(ask.spec, seed=ask.seed, global_batch=b, **ask.dims) if b != batches[0] else wl
        (peak, activation), context = _at_batch(model, data, ask.precision, device)
        peaks.append(peak)
        held.append(activation)
        model.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return {"batches": list(batches), "peaks": peaks, "activation_peaks": held, "context": context,
            "how": "measured" if device.type == "cuda" else "traced"}


def _like_a_rank(device) -> None:
    """What a rank holds on its GPU besides its tensors before its first cell: a process group of
    one (NCCL's communicator) and cuBLAS in fp32 and bf16, so the context the probe reads is a rank's."""
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(device)
    try:
        dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1, device_id=device)
        x = torch.ones(64, 64, device=device)
        dist.all_reduce(x)
    except Exception:  # noqa: BLE001 - without NCCL the context is the CUDA one alone
        x = torch.ones(64, 64, device=device)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        (x @ x).float().sum().item()
    (x @ x).sum().item()


def _at_batch(model, wl, precision: str, device) -> tuple[tuple[float, float], float | None]:
    """((peak bytes above the step's start with no gradient at its start, as the harness trains;
    and with every gradient held: the activations alone), NVML's context bytes) of forward and
    backward of ``model`` on ``wl``'s first batch, after one pass that warms caches up."""
    import torch

    x, y = (t.to(device) for t in wl.batch(0))

    def fwd_bwd():
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
            out = model(x)
        wl.loss(out, y).backward()

    fwd_bwd()  # the first pass allocates what every later one reuses (cuBLAS workspaces, caches)
    got = []
    for set_to_none in (False, True):
        model.zero_grad(set_to_none=set_to_none)
        got.append(_peak_of(fwd_bwd, device))
    return (got[1], got[0]), _context_bytes(device) if device.type == "cuda" else None


def _peak_of(fn, device) -> float:
    """Bytes ``fn`` took above what was allocated when it started, at its fullest."""
    import torch

    if device.type != "cuda":
        mode = _live_bytes_mode()()
        with mode:
            fn()
        return float(mode.peak)
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    start = torch.cuda.memory_allocated(device)
    fn()
    torch.cuda.synchronize(device)
    return float(torch.cuda.max_memory_allocated(device) - start)


def _context_bytes(device) -> float | None:
    """What NVML sees this process use on ``device`` beyond the allocator's reservation."""
    import torch

    from bench.measure.nvml import process_used_bytes

    used = process_used_bytes(device.index)
    return None if used is None else used - float(torch.cuda.memory_reserved(device))


def main() -> int:
    asks = [Ask(**{**a, "batches": tuple(a["batches"])}) for a in json.loads(sys.stdin.read())]
    for i, ask in enumerate(asks):
        t0 = time.perf_counter()
        try:
            got = _one(ask)
        except Exception as e:  # noqa: BLE001 - a probe that fails is a reason, not a crash
            name = type(e).__name__
            what = "out of memory" if "OutOfMemory" in name or "out of memory" in str(e) else f"{name}: {e}"
            got = {"reason": f"the activation probe at micro-batch {ask.batches[0]} failed: {what}"[:300]}
        got.update(index=i, seconds=round(time.perf_counter() - t0, 2))
        print("PROBE " + json.dumps(got), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
