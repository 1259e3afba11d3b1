"""Cells that cannot fit, known before anything starts.

Training holds at least each parameter and its gradient, in the dtype the model builds them in (a
frozen parameter has no gradient): ``train_bytes``, counted on the meta device when the run is
planned (bf16 autocast and FSDP's mixed precision keep the parameters and gradients they shard in
fp32), and Adam's and AdamW's two state values per trainable parameter (SGD keeps none). A strategy
that keeps a whole copy of the model on every device needs all of it on each; one that cuts the
model in n parts needs at least 1/n of it on its fullest device, and one that shards only the
optimizer state (ZeRO-1) 1/n of the state. Activations, buffers and the CUDA context
come on top, so this lower bound never skips a cell that could run: it only spares the budget the
cells that would certainly run out of memory (a 20B-parameter model on one 80 GB GPU), and says
why in words the recommendation reads as running out of memory.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any

from bench.core.memory import GIB, MARGIN, Footprint, Model, Probe, Terms, largest_batch, predict
from bench.core.spec import CellSpec

log = logging.getLogger("parbench")


def device_memory(device: str) -> int | None:
    """Bytes a cell's device holds: the largest GPU that CUDA_VISIBLE_DEVICES shows (NVML, matched by
    index or UUID; None for MIG slices), or the host's memory on CPU (shared by the ranks of a node);
    None when unknown."""
    try:
        if device == "cuda":
            import pynvml as nv

            nv.nvmlInit()
            try:
                handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(nv.nvmlDeviceGetCount())]
                shown = os.environ.get("CUDA_VISIBLE_DEVICES")
                if shown is not None:

                    def uuid(h) -> str:
                        u = nv.nvmlDeviceGetUUID(h)
                        return u.decode() if isinstance(u, bytes) else u

                    picked = []
                    for token in (t.strip() for t in shown.split(",") if t.strip()):
                        if token.isdigit() and int(token) < len(handles):
                            picked.append(handles[int(token)])
                        elif token.startswith("GPU-"):
                            picked += [h for h in handles if uuid(h).startswith(token)]
                        else:
                            return None  # a MIG slice or a name NVML does not list: unknown
                    handles = picked
                return max((nv.nvmlDeviceGetMemoryInfo(h).total for h in handles), default=None)
            finally:
                nv.nvmlShutdown()
        import psutil

        return int(psutil.virtual_memory().total)
    except Exception:  # noqa: BLE001 - no NVML or psutil: nothing is skipped for memory
        return None


def memory_reason(cell: CellSpec, share: float, memory: int | None, state_share: float | None = None) -> str | None:
    """Why ``cell`` cannot fit, or None: its parameters and gradients at ``share`` of the model on
    its fullest device, with its optimizer's state at ``state_share`` (default ``share``), (on CPU,
    the node's ranks together) against ``memory``. The planner asks it of runs on one node only
    (every node of a run plans the same matrix)."""
    params, total = cell.workload.params, cell.workload.train_bytes
    if not params or not total or not memory:
        return None
    state = 2 * (cell.workload.trainable_bytes or 0) if cell.training.optimizer in ("adam", "adamw") else 0
    per_device = total * share + state * (share if state_share is None else state_share)
    if cell.device == "cuda":
        need, where = per_device, "on one GPU"
    else:
        need, where = per_device * cell.n_devices, "in this host's memory"
    if need <= memory:
        return None
    held = "a whole copy on each device" if share >= 1 else f"at least 1/{round(1 / share)} of it on a device"
    return (f"out of memory before it starts: {params / 1e9:.1f}B parameters, {held}, need "
            f"{need / 2**30:.1f} GiB {where} for their values and gradients"
            f"{f' and {cell.training.optimizer} state' if state else ''} alone, more than the total "
            f"capacity of {memory / 2**30:.1f} GiB; cut the model (fsdp, tensor, a pipeline) or use more devices")


#: How far beyond one device the default matrix's large model reaches: its parameters and gradients
#: alone take this many times one GPU's memory, so the plan skips the one-device reference and DDP
#: by arithmetic, and cut in two it still leaves room for activations.
BEYOND_MARGIN = 1.05


def beyond_one_device(device: str = "cuda") -> str | None:
    """The default matrix's model that no single visible GPU holds: gpt-20b's shape with as many
    layers as take :data:`BEYOND_MARGIN` times the largest visible GPU's memory in fp32 parameters,
    gradients and the default optimizer's (AdamW's) two state values, 16 bytes a parameter; None
    when unknown."""
    memory = device_memory(device) if device == "cuda" else None
    if not memory:
        return None
    from bench.workloads.gpt import layers_beyond

    return f"gpt-20b[n_layer={layers_beyond(memory, margin=BEYOND_MARGIN, bytes_per_param=16)}]"


# -- the memory model's prediction for every planned cell -------------------------------------------

def probing(setting: str, device: str) -> bool:
    """Whether the run probes activations: ``on``, ``off``, or ``auto`` (on a GPU only: a CPU run
    measures no allocator peak to hold a prediction against)."""
    return setting == "on" or (setting == "auto" and device == "cuda")


def predict_cells(cells: list[Any], *, device: str, memory: int | None, probe: bool) -> list[Any]:
    """Every runnable cell (a bench.plan.matrix.Planned) with its predicted :class:`Footprint`
    (``spec.memory``), and skipped (a reason saying out of memory, what the prediction is made of
    and the largest micro-batch that fits) when even its prediction cut by :data:`MARGIN` exceeds
    ``memory``. ``probe``: run the activation probe (:mod:`bench.plan.probe`) for the workloads
    whose cells can run."""
    import strategies

    runnable = [p for p in cells if p.reason is None]
    terms = {p.spec.cell_id: strategies.get(p.spec.strategy_spec).memory_terms(p.spec) for p in runnable}
    probes = _probes(runnable, terms, device, memory) if probe else {}
    out = []
    for p in cells:
        if p.reason is not None:
            out.append(p)
            continue
        model = cell_model(p.spec, probes.get(_probe_key(p.spec, device)))
        t = terms[p.spec.cell_id]
        fp = predict(model, t)
        per_node = max(1, p.spec.procs_per_node) if device != "cuda" else 1
        room = memory / per_node if memory else None
        if room:
            fits = largest_batch(model, lambda b, t=t: dataclasses.replace(t, micro_batch=b), room)
            fp = dataclasses.replace(fp, batch_fits=fits, capacity=float(room))
        spec = dataclasses.replace(p.spec, memory=fp)
        out.append(dataclasses.replace(p, spec=spec, reason=fit_reason(spec, fp, room)))
    return out


def cell_model(cell: CellSpec, probe: Probe | str | None) -> Model:
    """The memory model's facts of ``cell``'s workload under its training setting."""
    w = cell.workload
    trainable = float(w.trainable_bytes or 0)
    params = float((w.train_bytes or 0) - trainable)
    data = float(cell.measure.staged_batches() * w.global_batch * (w.sample_bytes or 0))
    return Model(param_bytes=params, trainable_bytes=trainable, optimizer=cell.training.optimizer, device=cell.device,
                 data=data, probe=probe if isinstance(probe, Probe) else None,
                 probe_note=probe if isinstance(probe, str) else "")


def fit_reason(cell: CellSpec, fp: Footprint, room: float | None) -> str | None:
    """Why ``cell`` will not fit in ``room`` bytes a rank (None when it may): its predicted peak, cut
    by the margin, is larger."""
    need = fp.required
    if not room or not need or need * (1 - MARGIN) <= room:
        return None
    where = "on one GPU" if cell.device == "cuda" else "per rank in this host's memory"
    parts = ", ".join(f"{k} {v / GIB:.1f}" for k, v in fp.components().items() if v >= 0.05 * GIB)
    bound = " at least (activations not probed)" if fp.lower_bound else ""
    fits = fp.batch_fits
    batch = ("" if fits is None else "; not one sample per device fits" if fits == 0 else
             f"; at most {fits} samples per device would fit (this cell: {fp.micro_batch})")
    ac = "checkpoint activations (--ac full), " if cell.training.ac != "full" else ""
    return (f"out of memory before it starts: predicted peak {need / GIB:.1f} GiB{bound} ({parts}) > "
            f"{room / GIB:.1f} GiB {where}{batch}; {ac}shard the model and its optimizer state (fsdp), use more "
            f"devices or a smaller batch")


def _probe_key(cell: CellSpec, device: str) -> tuple:
    dims = {k: v for k, v in cell.workload.dims.items() if k != "global_batch"}
    return (cell.workload.spec, tuple(sorted(dims.items())), cell.measure.precision, cell.training.ac, device)


def _probes(runnable: list[Any], terms: dict[int, Terms], device: str, memory: int | None) -> dict:
    """The activation probes the runnable cells need, one per (workload, precision, checkpointing),
    for the models one device can hold (parameters and gradients within ``memory``)."""
    from bench.plan.probe import Ask, probe_batches, run_probes

    wanted: dict[tuple, tuple[CellSpec, list[int]]] = {}
    for p in runnable:
        c = p.spec
        if memory and device == "cuda" and (c.workload.train_bytes or 0) > memory:
            continue  # its parameters and gradients alone exceed one device: no probe can run
        key = _probe_key(c, device)
        t = terms[c.cell_id]
        wanted.setdefault(key, (c, []))[1].append(t.micro_batch * t.in_flight)
    known = {k: _PROBED[k] for k in wanted if k in _PROBED}
    asks = []
    for key, (c, batches) in wanted.items():
        if key in known:
            continue
        asks.append(Ask(spec=c.workload.spec, dims=dict(key[1]), seed=c.measure.seed, precision=key[2], ac=key[3],
                        device=device, batches=probe_batches(batches)))
    got = run_probes(asks)
    for key, value in got.items():
        if isinstance(value, str):
            log.warning("parbench run: %s: %s; its memory predictions are lower bounds", key[0], value)
        else:
            _PROBED[key] = value
    return {**known, **got}


#: The probes this process ran, by (workload, dimensions, precision, checkpointing, device): the knob
#: search plans the screened workloads again at other batches, which the probe's line extrapolates
_PROBED: dict[tuple, Any] = {}
