"""Inference versions of the workloads: what one request computes, on one device or cut in stages.

* GPT, ``task="score"``: prefill only; a request is one prompt of ``size`` tokens and its answer the
  mean log-likelihood of the prompt under the model (one forward, no cache).
* GPT, ``task="generate"``: prefill the prompt, then ``gen_tokens`` greedy steps with a KV cache
  (fixed output length, so every request does the same decode work). The cache is built here by
  calling the training GPT's own modules (its Linear/LayerNorm/Embedding weights): ``gpt.py`` is
  untouched and the weights are the ones training uses. Piece by piece (:func:`kv_piece`), so a
  pipeline stage runs its share of the pieces with its share of the cache.
* Everything else (convnet, user workloads through ``package.module:factory``): a request is
  ``size`` rows of the workload's batch; the answer is the model's output for those rows
  (classification logits for the convnet).

Inputs are made from (seed, request id, size), so any process makes the same request's input
without it crossing a queue. Precision: bf16 on CUDA, fp32 on CPU (``auto``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from bench.workloads import Workload
from bench.workloads.gpt import GPT, Block, Embed, Head

TASKS = ("score", "generate", "classify")
#: distinct input batches requests draw from (request rid uses batch rid mod this)
INPUT_POOL = 32


def resolve_precision(precision: str, device: torch.device) -> torch.dtype:
    """auto: bf16 on CUDA, fp32 on CPU."""
    if precision == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return {"fp32": torch.float32, "bf16": torch.bfloat16}[precision]


def kv_piece(piece: nn.Module, x: Tensor, start: int, cache: tuple[Tensor, Tensor] | None) -> \
        tuple[Tensor, tuple[Tensor, Tensor] | None]:
    """One piece of a :class:`GPT` (embed, block or head) on tokens or activations at positions
    ``start``.., with the block's KV ``cache`` of the earlier positions (None: a prefill, causal over
    ``x``); returns its output (the head: the last position's logits) and the block's cache after."""
    if isinstance(piece, Embed):
        pos = torch.arange(start, start + x.shape[1], device=x.device)
        return piece.tok(x) + piece.pos(pos), None
    if isinstance(piece, Head):
        return piece(x[:, -1:]), None
    if not isinstance(piece, Block):
        raise TypeError(f"generation with a KV cache runs GPT pieces (Embed, Block, Head), not {type(piece).__name__}")
    a = piece.attn
    h = piece.ln1(x)
    b, t, _ = h.shape
    q, k, v = a.heads(h)
    if cache is not None:
        k = torch.cat([cache[0], k], dim=2)
        v = torch.cat([cache[1], v], dim=2)
    # prefill: causal over the prompt; decode: one query sees every cached position
    y = F.scaled_dot_product_attention(q, k, v, is_causal=cache is None)
    x = x + a.o(y.transpose(1, 2).reshape(b, t, -1))
    return x + piece.mlp(piece.ln2(x)), (k, v)


def kv_run(pieces: list[nn.Module], x: Tensor, start: int, cache: list | None) -> tuple[Tensor, list]:
    """``pieces`` in turn (a whole GPT, or one pipeline stage's share of it) with their caches."""
    new = []
    for i, piece in enumerate(pieces):
        x, c = kv_piece(piece, x, start, None if cache is None else cache[i])
        new.append(c)
    return x, new


def next_token(logits: Tensor) -> Tensor:
    """Greedy choice from the head's last-position logits: (B, 1) token ids."""
    return logits[:, -1].float().argmax(-1, keepdim=True)


class KVGenerate(nn.Module):
    """Greedy generation of ``new_tokens`` tokens with a KV cache over a :class:`GPT`'s modules."""

    def __init__(self, gpt: GPT, new_tokens: int):
        super().__init__()
        # only the GPT is a submodule: nn.DataParallel's replicas must see their own copy's parts
        self.gpt, self.new_tokens = gpt, new_tokens

    @torch.no_grad()
    def forward(self, idx: Tensor) -> Tensor:
        pieces = list(self.gpt)
        logits, cache = kv_run(pieces, idx, 0, None)
        out = []
        pos = idx.shape[1]
        for _ in range(self.new_tokens):
            nxt = next_token(logits)
            out.append(nxt)
            if len(out) == self.new_tokens:
                break
            logits, cache = kv_run(pieces, nxt, pos, cache)
            pos += 1
        return torch.cat(out, dim=1)


@torch.no_grad()
def generate_naive(gpt: GPT, idx: Tensor, new_tokens: int) -> Tensor:
    """Greedy generation recomputing the whole sequence each step: the reference the cache must equal."""
    seq, out = idx, []
    for _ in range(new_tokens):
        nxt = gpt(seq)[:, -1].float().argmax(-1, keepdim=True)
        out.append(nxt)
        seq = torch.cat([seq, nxt], dim=1)
    return torch.cat(out, dim=1)


def score(logits: Tensor, idx: Tensor, lengths: Tensor | None = None) -> Tensor:
    """Mean log-likelihood of each prompt's tokens 2..T given their prefixes: (B,) fp32. With
    ``lengths`` the prompts are right-padded to a common T and row b counts its first lengths[b]
    tokens only (causal attention: a prompt's positions never see the padding after them)."""
    if idx.shape[1] < 2:
        return torch.zeros(idx.shape[0], device=logits.device)
    lp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    tok = lp.gather(-1, idx[:, 1:, None]).squeeze(-1)
    if lengths is None:
        return tok.mean(dim=1)
    n = (lengths.to(tok.device) - 1).clamp_min(0)
    keep = torch.arange(tok.shape[1], device=tok.device)[None, :] < n[:, None]
    return torch.where(n > 0, (tok * keep).sum(dim=1) / n.clamp_min(1), torch.zeros_like(n, dtype=tok.dtype))


@dataclass
class ServeModel:
    """A workload's model ready to answer requests on ``device`` at ``dtype``."""

    workload: Workload
    task: str
    gen_tokens: int
    seed: int
    is_gpt: bool
    max_size: int

    @staticmethod
    def create(wl: Workload, *, task: str, gen_tokens: int, seed: int) -> ServeModel:
        probe = wl.build(torch.device("meta"))
        is_gpt = isinstance(probe, GPT)
        if task == "auto":
            task = "score" if is_gpt else "classify"
        if task not in TASKS or (task != "classify") != is_gpt:
            raise ValueError(f"task {task!r} does not fit {wl.name}: GPT workloads take score or generate, "
                             "others classify")
        x = wl.batch(0)[0]
        if is_gpt:
            max_size = x.shape[1] - (gen_tokens if task == "generate" else 0)
        else:
            max_size = x.shape[0]
        if max_size < 1:
            raise ValueError(f"{wl.name}: seq_len {x.shape[1]} leaves no room for {gen_tokens} generated tokens")
        return ServeModel(workload=wl, task=task, gen_tokens=gen_tokens, seed=seed, is_gpt=is_gpt, max_size=max_size)

    def build(self, device: torch.device, dtype: torch.dtype) -> nn.Module:
        """The model on ``device`` in eval mode at ``dtype`` (floating parameters only). Its weights
        are initialised on the host from the seed and then moved, so every process gets the same
        weights whatever its device, and a pipeline stage (``build(cpu)``, then its part moved) never
        holds the whole model on its GPU: the placement for a model too big for one device."""
        m = self.workload.build(torch.device("cpu")).eval()
        if dtype != torch.float32:
            m = m.to(dtype=dtype)
        for p in m.parameters():
            p.requires_grad_(False)
        return m.to(device)

    def _data(self, step: int) -> Tensor:
        # The workload's batch of ``step``, cached: making a convnet batch costs about a millisecond
        # of the serving process's time, which would otherwise sit in every request's queue time.
        cache = self.__dict__.setdefault("_cache", {})
        if step not in cache:
            if len(cache) >= INPUT_POOL:
                cache.pop(next(iter(cache)))
            cache[step] = self.workload.batch(step)[0]
        return cache[step]

    def make_input(self, rid: int, size: int) -> Tensor:
        """The input of request ``rid``: ``size`` tokens of one prompt (GPT) or ``size`` rows of the
        workload's batch number ``rid mod INPUT_POOL`` (deterministic: any process makes the same)."""
        x = self._data(rid % INPUT_POOL)
        size = min(size, self.max_size)
        return x[:1, :size].contiguous() if self.is_gpt else x[:size].contiguous()

    def parts(self, model: nn.Module, n: int) -> list[nn.Module]:
        """``model``'s blocks cut into ``n`` contiguous stages of near-equal block count."""
        blocks = self.workload.blocks(model)
        if n > len(blocks):
            raise ValueError(f"{self.workload.name} has {len(blocks)} blocks, fewer than {n} stages")
        cuts = [round(i * len(blocks) / n) for i in range(n + 1)]
        return [nn.Sequential(*blocks[a:b]) for a, b in zip(cuts[:-1], cuts[1:])]

    def finish(self, out: Tensor, inp: Tensor, lengths: Tensor | None = None) -> Tensor:
        """What a request gets back from the last block's output (``lengths``: right-padded prompts)."""
        return score(out, inp.to(out.device), lengths) if self.task == "score" else out.float()

    def runner(self, model: nn.Module) -> nn.Module:
        """A module input -> answer (what a replica or nn.DataParallel runs)."""
        return KVGenerate(model, self.gen_tokens) if self.task == "generate" else _Finish(self, model)

    def tokens(self, size: int) -> int:
        """Tokens a request of ``size`` processes (prompt and generated), 0 for non-GPT."""
        if not self.is_gpt:
            return 0
        return min(size, self.max_size) + (self.gen_tokens if self.task == "generate" else 0)

    def samples(self, size: int) -> int:
        """Samples in a request: one sequence for GPT, ``size`` rows otherwise."""
        return 1 if self.is_gpt else min(size, self.max_size)


class _Finish(nn.Module):
    def __init__(self, sm: ServeModel, model: nn.Module):
        super().__init__()
        self.sm, self.model = sm, model

    @torch.no_grad()
    def forward(self, x: Tensor, lengths: Tensor | None = None) -> Tensor:
        return self.sm.finish(self.model(x), x, lengths)


class Graphed:
    """``fn`` replayed from a CUDA graph per input shape (and lengths' shape), captured the first
    time the shape comes: a replica's forward without the host's kernel launches on its path.

    One H200 served gpt-small's single scoring requests of 16-96 tokens in 1.24-2.15 ms each eager,
    over four fresh processes, its GPU waiting on the launches; in 0.19-0.20 ms from graphs
    (docs/evidence/serve-forward-h200.csv). The graphs share one memory pool: they replay one at a
    time and each answer is copied off the device before the next replay (:func:`run_grouped`,
    :func:`run_padded`), so a graph's output that a later capture's temporaries overlap is never
    read stale. Inputs are copied into each graph's own buffers, allocated outside the pool."""

    def __init__(self, fn, device: torch.device):
        self.fn, self.device = fn, device
        self.graphs: dict[tuple, tuple] = {}
        self.pool = None

    def __call__(self, x: Tensor, lengths: Tensor | None = None) -> Tensor:
        key = (tuple(x.shape), x.dtype, None if lengths is None else tuple(lengths.shape))
        if key not in self.graphs:
            self.graphs[key] = self._capture(x, lengths)
        graph, sx, sl, sy = self.graphs[key]
        sx.copy_(x, non_blocking=True)
        if sl is not None:
            sl.copy_(lengths, non_blocking=True)
        graph.replay()
        return sy

    def _capture(self, x: Tensor, lengths: Tensor | None) -> tuple:
        sx = x.clone()
        sl = None if lengths is None else lengths.clone()
        args = (sx,) if sl is None else (sx, sl)
        side, main = torch.cuda.Stream(self.device), torch.cuda.current_stream(self.device)
        side.wait_stream(main)
        with torch.cuda.stream(side):  # kernel selection and the allocator's growth, outside capture
            for _ in range(2):
                self.fn(*args)
        main.wait_stream(side)
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, pool=self.pool):
                sy = self.fn(*args)
        except RuntimeError as e:  # a forward that syncs with the host, or whose work depends on values
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            # the way out first: the serving process's one line keeps the start of a long message
            raise RuntimeError(f"CUDA graph capture failed at input shape {tuple(x.shape)}; --graphs off serves "
                               f"it eagerly: {first}") from e
        return graph, sx, sl, sy


#: A padded scoring batch is as long as its longest prompt rounded up to this many tokens (at most the
#: model's context), so the shapes a dynamic batcher makes are few enough to warm up before a cell:
#: on 4 H100s a batch policy whose padded batches of 2-7 prompts were each a new (rows, length)
#: shape ran p50 75 ms at 0.3 C and 8.8 ms at 0.9 C, where more batches were full.
PAD_MULTIPLE = 16


def padded_length(longest: int, limit: int | None = None) -> int:
    """The length a batch whose longest prompt has ``longest`` tokens is padded to."""
    n = -(-longest // PAD_MULTIPLE) * PAD_MULTIPLE
    return max(longest, min(n, limit)) if limit else n


def run_padded(fn, inputs: list[Tensor], device: torch.device, limit: int | None = None) -> list[Tensor]:
    """Run a scoring ``fn`` on prompts of any lengths as one call: right-padded to the longest
    (token 0), rounded up to :data:`PAD_MULTIPLE` but not past ``limit`` (the model's context), with
    their lengths beside, answers split back per request, on CPU."""
    lengths = torch.tensor([x.shape[1] for x in inputs])
    xs = torch.zeros(len(inputs), padded_length(int(lengths.max()), limit), dtype=inputs[0].dtype)
    for i, x in enumerate(inputs):
        xs[i, :x.shape[1]] = x[0]
    ys = fn(xs.to(device, non_blocking=True), lengths.to(device)).float().cpu()
    return [ys[i:i + 1] for i in range(len(inputs))]


def run_grouped(fn, inputs: list[Tensor], device: torch.device, dtype: torch.dtype, *,
                pad: bool = False, pad_limit: int | None = None) -> list[Tensor]:
    """Run ``fn`` on a batch of requests: inputs of one shape are concatenated into one call (a
    dynamic batch of equal-length prompts or of images), answers split back per request, on CPU.
    ``pad`` (GPT scoring): prompts of several lengths go as one right-padded call instead (with
    prompts of 16-96 tokens almost no two requests of a dynamic batch had one length, so it ran
    them one by one and each waited for the batch)."""
    if pad and len(inputs) > 1 and all(x.dim() == 2 and x.shape[0] == 1 for x in inputs):
        # equal lengths too: a batch's shape is then always one the warm-up ran (rows, padded length)
        return run_padded(fn, inputs, device, pad_limit)
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, x in enumerate(inputs):
        groups.setdefault(tuple(x.shape[1:]), []).append(i)
    out: list[Tensor | None] = [None] * len(inputs)
    for idx in groups.values():
        xs = torch.cat([inputs[i] for i in idx]).to(device, non_blocking=True)
        if xs.is_floating_point():
            xs = xs.to(dtype)
        ys = fn(xs)
        ys = ys.float().cpu()  # the copy to host waits for the device: the answer exists
        k = 0
        for i in idx:
            rows = inputs[i].shape[0]
            out[i] = ys[k:k + rows]
            k += rows
    return out  # type: ignore[return-value]
