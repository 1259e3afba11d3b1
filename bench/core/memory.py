"""The memory model: what the fullest device of a training cell holds at the peak of a step, by
component, before the cell runs.

A step's memory has two peaks, and the model predicts the larger:

* **backward**: everything that lives across steps (parameters, optimizer state, the strategy's
  buffers, the staged batches) plus the step's activations, which include the gradients that
  already exist when backward is at its fullest;
* **optimizer step**: the same persistent memory plus every gradient and the optimizer's
  temporaries (none for a fused or in-place update).

Each component is a term of the model's facts that a strategy declares its share of
(:class:`Terms`: ``Strategy.memory_terms``): the parameters, gradients and state it keeps on its
fullest device, the micro-batch a forward sees and how many are in flight at once, the share of the
activations it keeps (tensor parallel splits some), and its own buffers (DDP's buckets, FSDP2's
gathered units, a pipeline's send and receive buffers). The activation term is not a formula of one
architecture: it comes from a :class:`Probe`, one forward and backward of the workload's own model
on one device at two small micro-batches, fitted as a line in the micro-batch, so a user's model is
treated the same as a built-in one. The allocator's fragmentation (reserved over allocated), the
CUDA context and NCCL's communicator buffers are the fixed costs on top: the fragmentation a
declared term of the gradients and the allocated peak, the context as the probe measured it (in a
process set up as a rank is), NCCL's buffers a declared estimate.

Everything here is arithmetic on numbers (no torch): the planner, the row builder and the report
read the same :class:`Footprint`.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

GIB = 2**30

#: The margin the planner states with a prediction (:attr:`Footprint.required`): a cell is skipped
#: only when its prediction, cut by this share, still exceeds the device (so an over-prediction
#: within the margin never skips a cell that could run), and a batch "fits" when its prediction
#: grown by it does. The allocated peak was within 6% of the measured one over 48 cells.
MARGIN = 0.10

#: The caching allocator's reserved peak beyond its allocated one (its fragmentation: blocks cut
#: from larger segments, rounding), declared as a share of the gradients plus a share of the
#: allocated peak: gradients are freed after every step and allocated again in backward, into
#: segments split from the activations'. Fitted to 44 single-GPU cells from 55M to 7.7B parameters
#: (docs/evidence/memory-model-h200.csv), where it leaves the reserved peak within 17% (a fixed
#: ratio of the allocated peak: 23%); the allocated peak needs no such term.
FRAGMENTATION_GRADS = 0.5
FRAGMENTATION_ALLOCATED = 0.03

#: Bytes NCCL holds outside PyTorch's allocator for each communicator a rank of a multi-process CUDA
#: cell creates (its channels' send and receive buffers, NCCL_BUFFSIZE 4 MiB each, and proxies):
#: a declared estimate for the NVML figure, not a measurement of this machine.
NCCL_PER_COMMUNICATOR = 256 * 2**20


@dataclass(frozen=True, kw_only=True)
class Terms:
    """What a strategy declares of its fullest device: shares of the model's parameter, gradient
    and optimizer-state bytes, the micro-batch one of its forwards sees and how many micro-batches'
    activations it holds at once, the share of those activations it keeps, and its own buffers."""

    params: float = 1.0
    grads: float = 1.0
    state: float = 1.0
    micro_batch: int = 1
    in_flight: int = 1
    activations: float = 1.0
    buffers: float = 0.0  # bytes
    buffers_note: str = ""  # what the buffers are (the report's words)
    communicators: int = 0  # NCCL communicators the rank creates (CUDA, more than one process)
    how: str = "declared"  # "declared" (exact shares) or "approximate" (the strategy says which term is)


@dataclass(frozen=True, kw_only=True)
class Probe:
    """One forward and backward of a workload's model on one device at each of ``batches``
    micro-batches, twice. ``peaks``: the bytes above the step's start (parameters, no gradient, as
    the harness trains) at the fullest point, the gradients that exist then included; at a small
    batch that point is late in backward, where the gradients dominate. ``activation_peaks``: the
    same with every gradient already allocated (so not counted): the activations alone, whose
    fullest point (early in backward) dominates at a large batch. The activation term at a batch is
    the larger of the two lines there. ``context``: what NVML saw the process (set up as a rank: a
    process group, cuBLAS) use beyond the allocator's reservation. ``how``: "measured" (CUDA's
    allocator peak) or "traced" (live tensor bytes counted on CPU)."""

    batches: tuple[int, ...]
    peaks: tuple[float, ...]
    activation_peaks: tuple[float, ...] = ()
    context: float | None = None
    how: str = "measured"

    def activations(self, batch: float) -> float:
        """The activation term at ``batch`` samples: the larger of the two lines (``peaks`` and
        ``activation_peaks``) there; never negative."""
        lines = [_line(self.batches, self.peaks, batch)]
        if len(self.activation_peaks) == len(self.batches):
            lines.append(_line(self.batches, self.activation_peaks, batch))
        return max(0.0, *lines)

    def per_sample(self) -> float:
        """Bytes the activation term grows by per sample of micro-batch, at large batches."""
        return max(0.0, self.activations(1e6 + 1) - self.activations(1e6))


def _line(b: tuple[int, ...], p: tuple[float, ...], at: float) -> float:
    """The least-squares line through the points (``b``, ``p``) at ``at`` (the intercept is what
    does not grow with the batch: workspaces, gradients); through the origin from a single point."""
    if len(b) == 1 or len(set(b)) == 1:
        return p[0] * at / b[0] if b[0] else 0.0
    n = len(b)
    mb, mp = sum(b) / n, sum(p) / n
    slope = sum((x - mb) * (y - mp) for x, y in zip(b, p)) / sum((x - mb) ** 2 for x in b)
    return mp + slope * (at - mb)


@dataclass(frozen=True, kw_only=True)
class Footprint:
    """The predicted peak of a cell's fullest device, by component (bytes). ``activations`` None:
    no probe (the model did not fit one device at the probe's batch, or the probe failed): the
    figure is then a lower bound. ``allocated`` is what PyTorch's allocator hands out at the peak,
    ``reserved`` what it holds from CUDA, ``process`` what NVML sees the process use."""

    params: float
    grads: float
    optimizer: float
    activations: float | None
    buffers: float
    data: float  # the batches staged on the device before timing
    temporaries: float = 0.0  # the optimizer step's own (a multi-tensor Adam's intermediate)
    fragmentation: float | None = None  # reserved beyond allocated (CUDA's caching allocator)
    context: float | None = None
    comm: float = 0.0
    micro_batch: int = 1
    how: str = "declared"
    probe_note: str = ""  # why the activations were not probed, when they were not
    # The planner's: the largest micro-batch per device predicted to fit (0: none; None: unknown),
    # and the bytes a rank has (one GPU, or the host's memory over its ranks)
    batch_fits: int | None = None
    capacity: float | None = None

    @property
    def persistent(self) -> float:
        """What lives across steps: parameters, optimizer state, buffers, staged batches."""
        return self.params + self.optimizer + self.buffers + self.data

    @property
    def backward_peak(self) -> float:
        return self.persistent + (self.activations or 0.0)

    @property
    def step_peak(self) -> float:
        return self.persistent + self.grads + self.temporaries

    @property
    def allocated(self) -> float:
        return max(self.backward_peak, self.step_peak)

    @property
    def reserved(self) -> float | None:
        return None if self.fragmentation is None else self.allocated + self.fragmentation

    @property
    def process(self) -> float | None:
        r = self.reserved
        return None if r is None or self.context is None else r + self.context + self.comm

    @property
    def required(self) -> float:
        """What must fit in the device: the allocated peak, the CUDA context and NCCL's buffers. The
        fragmentation need not: the allocator frees its cached blocks and retries before it fails."""
        return self.allocated + (self.context or 0.0) + self.comm

    @property
    def lower_bound(self) -> bool:
        return self.activations is None

    @property
    def at(self) -> str:
        """Which peak the prediction is: "backward" or "optimizer step"."""
        return "backward" if self.backward_peak >= self.step_peak else "optimizer step"

    def components(self) -> dict[str, float]:
        """The allocated peak's parts in the order the report stacks them (the gradients counted at
        the optimizer step's peak, the activations at backward's: the larger of the two shows)."""
        peak_grads = self.grads + self.temporaries if self.at == "optimizer step" else 0.0
        return {"params": self.params, "grads": peak_grads, "optimizer": self.optimizer,
                "activations": (self.activations or 0.0) if self.at == "backward" else 0.0,
                "buffers": self.buffers, "data": self.data}

    def columns(self) -> dict[str, float | str | None]:
        """The row's ``mem_pred_*`` columns."""
        return {"mem_pred_bytes": self.allocated, "mem_pred_reserved_bytes": self.reserved,
                "mem_pred_process_bytes": self.process, "mem_pred_params_bytes": self.params,
                "mem_pred_grads_bytes": self.grads, "mem_pred_optimizer_bytes": self.optimizer,
                "mem_pred_activations_bytes": self.activations, "mem_pred_buffers_bytes": self.buffers,
                "mem_pred_data_bytes": self.data, "mem_pred_temporaries_bytes": self.temporaries,
                "mem_pred_micro_batch": self.micro_batch, "mem_pred_at": self.at,
                "mem_pred_how": self.how_text(),
                "mem_batch_fits": self.batch_fits, "mem_capacity_bytes": self.capacity}

    def how_text(self) -> str:
        """How the prediction was made, in words (a lower bound says why)."""
        if not self.lower_bound:
            return self.how
        return "lower bound: activations not probed" + (f" ({self.probe_note})" if self.probe_note else "")

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def optimizer_state_bytes(optimizer: str, trainable_bytes: float) -> float:
    """Bytes of optimizer state per trainable bytes: Adam and AdamW keep two values of the
    parameter's dtype for each (SGD without momentum keeps none)."""
    return 2.0 * trainable_bytes if optimizer in ("adam", "adamw") else 0.0


def optimizer_temporaries(optimizer: str, device: str, state_share_bytes: float) -> float:
    """The optimizer step's own intermediate bytes: none for the fused CUDA update or SGD's
    in-place one; the multi-tensor (foreach) Adam on CPU builds one full-size intermediate (the
    square root of the second moment) over the parameters it updates."""
    if optimizer in ("adam", "adamw") and device != "cuda":
        return state_share_bytes / 2
    return 0.0


@dataclass(frozen=True, kw_only=True)
class Model:
    """The facts a prediction needs of one workload under one training setting."""

    param_bytes: float  # every parameter, as the model builds them
    trainable_bytes: float  # the trainable ones (each has a gradient of its size)
    optimizer: str
    device: str
    data: float  # staged batch bytes, whatever the strategy
    probe: Probe | None
    probe_note: str = ""  # why there is no probe


def predict(model: Model, terms: Terms) -> Footprint:
    """The cell's :class:`Footprint` from the workload's facts and the strategy's declared terms."""
    state = optimizer_state_bytes(model.optimizer, model.trainable_bytes) * terms.state
    acts = None
    if model.probe is not None:
        acts = model.probe.activations(terms.micro_batch * terms.in_flight) * terms.activations
    probe = model.probe
    comm = NCCL_PER_COMMUNICATOR * terms.communicators if model.device == "cuda" else 0.0
    how = terms.how if probe is None else f"{terms.how}; activations {probe.how}"
    grads = model.trainable_bytes * terms.grads
    temporaries = optimizer_temporaries(model.optimizer, model.device, state)
    allocated = model.param_bytes * terms.params + state + terms.buffers + model.data + max(acts or 0.0,
                                                                                            grads + temporaries)
    fragmentation = (FRAGMENTATION_GRADS * grads + FRAGMENTATION_ALLOCATED * allocated
                     if model.device == "cuda" else None)
    return Footprint(params=model.param_bytes * terms.params, grads=grads, optimizer=state, activations=acts,
                     buffers=terms.buffers, data=model.data, temporaries=temporaries, fragmentation=fragmentation,
                     context=probe.context if probe else None, comm=comm, micro_batch=terms.micro_batch, how=how,
                     probe_note=model.probe_note)


def largest_batch(model: Model, terms_at, capacity: float, *, limit: int = 1 << 16) -> int | None:
    """The largest micro-batch per device whose predicted peak, grown by :data:`MARGIN`, fits in
    ``capacity`` bytes (``terms_at(b)``: the strategy's terms at micro-batch ``b``); 0 when not
    even one sample fits; None without a probe (the activations are unknown)."""
    if model.probe is None or not capacity:
        return None

    def fits(b: int) -> bool:
        return predict(model, terms_at(b)).required * (1 + MARGIN) <= capacity

    if not fits(1):
        return 0
    lo, hi = 1, 2
    while hi <= limit and fits(hi):
        lo, hi = hi, hi * 2
    if hi > limit:
        return lo
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def error(predicted: float | None, measured: float | None) -> float | None:
    """predicted / measured - 1, or None where either is missing or the measurement is not positive."""
    if predicted is None or measured is None or measured != measured or measured <= 0 or predicted != predicted:
        return None
    return predicted / measured - 1
