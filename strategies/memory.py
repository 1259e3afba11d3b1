"""The arithmetic behind the strategies' memory terms (``Strategy.memory_terms``): what each rank
holds of every parameter, from the layout the planner counted on the meta device
(``WorkloadFacts.param_shapes``, ``boundary_bytes``, ``tp_dims``), turned into the shares of the
memory model (bench.core.memory.Terms).

A share is the fullest rank's bytes over the model's: the parameters over every parameter's bytes,
the gradients and the optimizer state over the trainable parameters' (a frozen parameter has no
gradient and no state). Each component takes its own fullest rank, as the rows' ``held_*`` columns
take the largest count over the ranks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from math import prod

from bench.core.memory import Terms
from bench.core.spec import WorkloadFacts


@dataclass(frozen=True)
class Param:
    """One parameter of the layout: the first block holding it (-1: none), bytes per element,
    whether it trains, its shape."""

    block: int
    element: int
    trainable: bool
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return prod(self.shape) * self.element


def layout(facts: WorkloadFacts) -> list[Param] | None:
    """The workload's parameters in ``model.parameters()`` order, or None where the planner could
    not count them."""
    if not facts.param_shapes:
        return None
    return [Param(block=s[0], element=s[1], trainable=bool(s[2]), shape=tuple(s[3:])) for s in facts.param_shapes]


def chunk(size: int, n: int) -> int:
    """The largest piece of ``size`` split in ``n`` by ``torch.chunk`` (DTensor's ``Shard`` and
    FSDP2's dim-0 sharding both cut so: every piece ceil(size / n), the last ones shorter)."""
    return -(-size // n) if n > 1 else size


def local_elements(shape: Sequence[int], *, tp_dim: int = -1, tp: int = 1, dp: int = 1) -> int:
    """Elements of one parameter on the fullest rank: the tensor-parallel shard along ``tp_dim``
    over ``tp`` ranks (rank 0's piece is the largest), then FSDP2's shard of that along dimension 0
    over ``dp`` ranks, padded to ceil(rows / dp) rows on every rank (FSDP2 allocates each rank's
    shard at the padded size and the gradient's reduce-scatter output at the same size)."""
    dims = list(shape)
    if not dims:
        return 1
    if tp_dim >= 0 and tp > 1:
        dims[tp_dim] = chunk(dims[tp_dim], tp)
    if dp > 1:
        dims[0] = chunk(dims[0], dp)
    return prod(dims)


@dataclass(frozen=True)
class Held:
    """Bytes one rank holds: parameters, gradients (trainable parameters), optimizer-state basis
    (the trainable parameters whose state the rank keeps)."""

    params: float
    grads: float
    state: float


def held(params: Iterable[Param], local: Callable[[Param], int] | None = None,
         state_of: Callable[[Param], bool] | None = None) -> Held:
    """What one rank holds of ``params``: ``local(p)`` bytes of each (default: all of it), the
    gradient of each trainable one at the same size, and the state of those ``state_of`` keeps
    (default: every trainable one)."""
    local = local or (lambda p: p.nbytes)
    state_of = state_of or (lambda p: True)
    ps = gs = ss = 0.0
    for p in params:
        b = local(p)
        ps += b
        if p.trainable:
            gs += b
            ss += b if state_of(p) else 0
    return Held(params=ps, grads=gs, state=ss)


def shares(ranks: Sequence[Held], ps: Sequence[Param]) -> tuple[float, float, float]:
    """(params, grads, state) shares of the fullest rank of ``ranks``, each over the model's."""
    total = sum(p.nbytes for p in ps)
    trainable = sum(p.nbytes for p in ps if p.trainable)

    def share(x: float, of: float) -> float:
        return x / of if of else 1.0

    return (share(max(r.params for r in ranks), total), share(max(r.grads for r in ranks), trainable),
            share(max(r.state for r in ranks), trainable))


def zero_partition(ps: Sequence[Param], n: int) -> list[list[int]]:
    """The indices of ``ps`` each of ``n`` ranks owns under ZeroRedundancyOptimizer's default
    partition of one parameter group: largest parameter first (a stable sort on element count),
    each to the rank with the fewest elements so far (the lowest rank on a tie)."""
    owned: list[list[int]] = [[] for _ in range(n)]
    sizes = [0] * n
    for i in sorted(range(len(ps)), key=lambda i: prod(ps[i].shape), reverse=True):
        r = sizes.index(min(sizes))
        owned[r].append(i)
        sizes[r] += prod(ps[i].shape)
    return owned


def largest_bucket(sizes: Sequence[int], cap: int) -> int:
    """The largest of the greedy consecutive buckets of at most ``cap`` bytes that ``sizes`` (bytes
    of each gradient, in order, one dtype) fall into (strategies.allreduce.buckets: a tensor larger
    than the cap gets a bucket of its own)."""
    best = size = 0
    for i, s in enumerate(sizes):
        if i == 0 or size + s > cap:
            size = 0
        size += s
        best = max(best, size)
    return best


def block_elements(ps: Sequence[Param], n_blocks: int) -> list[int]:
    """Parameter elements of each block (a parameter counted in the first block holding it)."""
    out = [0] * n_blocks
    for p in ps:
        if 0 <= p.block < n_blocks:
            out[p.block] += prod(p.shape)
    return out


def in_blocks(ps: Sequence[Param], lo: int, hi: int) -> list[Param]:
    """The parameters of blocks ``lo`` to ``hi - 1``."""
    return [p for p in ps if lo <= p.block < hi]


def pipeline_in_flight(schedule: str, pp: int, m: int, virtual: int, rank: int = 0) -> int:
    """Micro-batch forwards (through one of its stages) whose activations pipeline rank ``rank``
    holds at once under torch.distributed.pipelining's schedules: GPipe runs every forward before
    any backward (m); 1F1B's rank r runs pp - r - 1 warm-up forwards and one more before its first
    backward (at most m); interleaved 1F1B's warm-up is (v - 1) x (micro-batches a round) + 2 x
    (pp - 1 - r) forwards of its v stages (``_get_warmup_ops``), one more before the first
    backward, at most m x v."""
    if schedule == "gpipe":
        return m
    if schedule == "1f1b":
        return min(m, pp - rank)
    rounds = max(1, m // pp)
    warmup = (virtual - 1) * (m // rounds) + 2 * (pp - 1 - rank)
    return min(warmup + 1, m * virtual)


def cut_terms(facts: WorkloadFacts, ps: Sequence[Param], ranks: Sequence[Sequence[tuple[int, int]]], *,
              micro_batch: int, in_flight: int, messages: int, bucket_cap: int | None = None,
              communicators: int = 0) -> Terms:
    """The terms of a model cut into stages of consecutive blocks, ``ranks[r]`` the (first, past
    last) block ranges rank r holds: each rank holds its stages' parameters, their gradients and
    state whole. Buffers (approximate): the receive buffers each stage allocates, ``messages`` of
    each (torch.distributed.pipelining's stage allocates one per micro-batch for its input
    activations and one for its output's gradient; the chain one of each), a micro-batch of the
    cut's boundary activation (``boundary_bytes``, fp32 as a meta forward gives it) each; and under
    ``bucket_cap`` the largest flat bucket of the stage's gradients the data-parallel all-reduce
    builds. Activations (approximate): the share of the blocks one stage holds."""
    n = facts.n_blocks
    per_rank = [held([p for lo, hi in stages for p in in_blocks(ps, lo, hi)]) for stages in ranks]
    params, grads, state = shares(per_rank, ps)
    bounds = facts.boundary_bytes or ()

    def edge(k: int) -> float:  # a micro-batch of the output of block k
        return float(bounds[k] * micro_batch) if 0 <= k < len(bounds) else 0.0

    buffers = []
    for stages in ranks:
        b = sum(messages * ((edge(lo - 1) if lo > 0 else 0.0) + (edge(hi - 1) if hi < n else 0.0))
                for lo, hi in stages)
        if bucket_cap is not None:
            b += largest_bucket([p.nbytes for lo, hi in stages for p in in_blocks(ps, lo, hi) if p.trainable],
                                bucket_cap)
        buffers.append(b)
    widest = max(sum(hi - lo for lo, hi in stages) / max(1, len(stages)) for stages in ranks)
    return Terms(params=params, grads=grads, state=state, micro_batch=micro_batch, in_flight=in_flight,
                 activations=widest / max(1, n), buffers=max(buffers),
                 buffers_note="stage receive buffers" + (" and the flat all-reduce bucket" if bucket_cap else ""),
                 communicators=communicators, how="approximate")  # buffers and activations: see above
