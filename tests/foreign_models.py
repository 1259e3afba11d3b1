"""Workloads written the way users write models, not the way ``bench/workloads/gpt.py`` is written.

They enter through the user-workload seam (``--workloads tests.foreign_models:encoder_stack``) and
exist to catch harness assumptions that only hold for the built-in GPT (module names, an
``nn.Sequential`` top module, a tensor-parallel plan that silently matches nothing):

* :func:`encoder_stack`: ``torch.nn.TransformerEncoder`` over ``nn.TransformerEncoderLayer``
  (fused ``in_proj_weight`` inside ``nn.MultiheadAttention``, forward with optional mask arguments)
  and no tensor-parallel plan, so ``tensor`` and ``fsdp-tp`` must be skipped, never run unsplit.
* :func:`fused_gpt`: a nanoGPT-style decoder (one fused ``c_attn`` producing q, k and v, no biases,
  ``transformer.h`` ModuleList, hand-written forward loop) with its own tensor-parallel plan that
  reorders the fused projection so that each rank owns whole heads of q, k and v.

Both are tiny (d=32..64, 6 layers: 8 blocks, enough for 4 ranks x 2 interleaved pipeline stages)
and deterministic from ``seed``: weights through :func:`bench.workloads.build_on`, batches from
``(seed, step)`` through :func:`bench.workloads.seeded`.
"""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from bench.workloads import Batch, Workload, build_on, seeded


def _token_batches(seed: int, vocab: int, seq_len: int, global_batch: int):
    """``batch(step)``: random tokens, inputs and next-token targets (the same on every rank)."""

    def batch(step: int) -> Batch:
        tokens = torch.randint(0, vocab, (global_batch, seq_len + 1), generator=seeded(seed, step))
        return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()

    return batch


def _token_loss(logits: Tensor, target: Tensor) -> Tensor:
    """Cross-entropy over every position, in fp32 whatever the autocast dtype."""
    return F.cross_entropy(logits.float().flatten(0, 1), target.flatten())


def _check_dims(d_model: int, n_head: int, n_layer: int, global_batch: int) -> None:
    # The factories raise TypeError for bad dimensions, as the built-in GPT does: the seam turns it
    # into a one-line UserError before anything launches.
    if d_model % n_head:
        raise TypeError(f"d_model={d_model} does not divide by n_head={n_head}")
    if n_layer < 1 or global_batch < 1:
        raise TypeError("n_layer and global_batch must be >= 1")


# --------------------------------------------------------------------------------------------
# (a) A stack of torch.nn.TransformerEncoderLayer
# --------------------------------------------------------------------------------------------


class TokenEmbedding(nn.Module):
    """Token embedding plus a learned positional parameter (a bare ``nn.Parameter`` of shape
    (1, T, d), as many users write it: its first dimension of 1 is what FSDP2 pads)."""

    def __init__(self, vocab: int, seq_len: int, d_model: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.pos = nn.Parameter(torch.randn(1, seq_len, d_model) * 0.02)

    def forward(self, idx: Tensor) -> Tensor:
        return self.embed(idx) + self.pos[:, : idx.shape[1]]


class EncoderLM(nn.Module):
    """Embedding, ``nn.TransformerEncoder`` (pre-norm layers, GELU, no dropout), LayerNorm + Linear
    head. No causal mask: ``blocks`` hands the layers to pipelines as plain modules called with one
    argument, and a mask applied only in this forward would make the two disagree."""

    def __init__(self, vocab: int, seq_len: int, d_model: int, n_head: int, n_layer: int):
        super().__init__()
        self.tokens = TokenEmbedding(vocab, seq_len, d_model)
        layer = nn.TransformerEncoderLayer(d_model, n_head, dim_feedforward=4 * d_model, dropout=0.0,
                                           activation="gelu", batch_first=True, norm_first=True)
        # enable_nested_tensor=False: the nested-tensor fast path is off with norm_first anyway, and
        # asking for it only warns.
        self.encoder = nn.TransformerEncoder(layer, n_layer, enable_nested_tensor=False)
        self.head = nn.Sequential(nn.LayerNorm(d_model), nn.Linear(d_model, vocab))

    def forward(self, idx: Tensor) -> Tensor:
        return self.head(self.encoder(self.tokens(idx)))


def encoder_blocks(model: nn.Module) -> list[nn.Module]:
    """[embedding, each encoder layer, head]: the encoder's ``layers`` ModuleList, not its children
    (``nn.TransformerEncoder`` itself is one child of the model)."""
    assert isinstance(model, EncoderLM), type(model)
    return [model.tokens, *model.encoder.layers, model.head]


def encoder_stack(*, seed: int = 0, vocab: int = 128, seq_len: int = 16, d_model: int = 32, n_head: int = 4,
                  n_layer: int = 6, global_batch: int = 8) -> Workload:
    """Next-token classification with a stack of ``nn.TransformerEncoderLayer``; no tensor-parallel
    plan, and no parameter count (the harness counts on the meta device, as for most user models)."""
    _check_dims(d_model, n_head, n_layer, global_batch)
    d, t = d_model, seq_len
    # 6N per token over the matmul weights (q, k, v, o, two MLP matrices, head) plus attention.
    matmul = n_layer * (4 * d * d + 8 * d * d) + d * vocab
    return Workload(
        name="encoder-stack",
        build=lambda device: build_on(device, seed, lambda: EncoderLM(vocab, t, d, n_head, n_layer)),
        batch=_token_batches(seed, vocab, t, global_batch),
        loss=_token_loss,
        global_batch=global_batch,
        flops_per_sample=float((6 * matmul + 12 * n_layer * d * t) * t),
        blocks=encoder_blocks,
        n_blocks=n_layer + 2,
        n_heads=n_head,
        description=f"nn.TransformerEncoder stack d={d} L={n_layer} H={n_head} T={t} V={vocab} (foreign model)",
    )


# --------------------------------------------------------------------------------------------
# (b) A nanoGPT-style GPT with fused qkv and its own tensor-parallel plan
# --------------------------------------------------------------------------------------------


class CausalSelfAttention(nn.Module):
    """nanoGPT's attention: one ``c_attn`` Linear gives q, k and v side by side. The head count and
    width are attributes (``n_head``, ``n_embd``) read in forward, so a tensor-parallel plan
    divides them by the degree, as torchtitan's plans adjust their models' head counts."""

    def __init__(self, d_model: int, n_head: int):
        super().__init__()
        self.c_attn = nn.Linear(d_model, 3 * d_model, bias=False)
        self.c_proj = nn.Linear(d_model, d_model, bias=False)
        self.n_head, self.n_embd = n_head, d_model

    def forward(self, x: Tensor) -> Tensor:
        b, t, _ = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        hs = self.n_embd // self.n_head
        q, k, v = (z.view(b, t, self.n_head, hs).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, self.n_embd))


class FeedForward(nn.Module):
    def __init__(self, d_model: int):
        super().__init__()
        self.fc = nn.Linear(d_model, 4 * d_model, bias=False)
        self.proj = nn.Linear(4 * d_model, d_model, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.proj(F.gelu(self.fc(x)))


class GPTBlock(nn.Module):
    def __init__(self, d_model: int, n_head: int):
        super().__init__()
        self.ln_1 = nn.LayerNorm(d_model, bias=False)
        self.attn = CausalSelfAttention(d_model, n_head)
        self.ln_2 = nn.LayerNorm(d_model, bias=False)
        self.mlp = FeedForward(d_model)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class Embeddings(nn.Module):
    """Token and position embeddings (nanoGPT's ``wte``/``wpe``) as one module, so that a pipeline
    can cut the model after it and FSDP can shard it as a unit."""

    def __init__(self, vocab: int, seq_len: int, d_model: int):
        super().__init__()
        self.wte = nn.Embedding(vocab, d_model)
        self.wpe = nn.Embedding(seq_len, d_model)

    def forward(self, idx: Tensor) -> Tensor:
        return self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))


class LMHead(nn.Module):
    """Final norm and (untied) vocabulary projection."""

    def __init__(self, vocab: int, d_model: int):
        super().__init__()
        self.ln_f = nn.LayerNorm(d_model, bias=False)
        self.lm_head = nn.Linear(d_model, vocab, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.lm_head(self.ln_f(x))


class FusedGPT(nn.Module):
    """nanoGPT layout: ``transformer.emb``, ``transformer.h`` (ModuleList), ``transformer.head``,
    and a forward that loops over ``h`` itself rather than being an ``nn.Sequential``.

    The embedding and head are submodules that the forward calls (rather than ``wte``/``wpe`` used
    inline), so that the wrappers :func:`fused_blocks` returns are the modules the forward runs:
    FSDP2 hooks on them fire, and running the blocks in sequence is this forward. Weights are not
    tied (nanoGPT ties ``wte`` and ``lm_head``; pipelines would put the two on different ranks)."""

    def __init__(self, vocab: int, seq_len: int, d_model: int, n_head: int, n_layer: int):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            emb=Embeddings(vocab, seq_len, d_model),
            h=nn.ModuleList(GPTBlock(d_model, n_head) for _ in range(n_layer)),
            head=LMHead(vocab, d_model),
        ))
        # nanoGPT's init: N(0, 0.02), residual projections scaled by 1/sqrt(2 L).
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                std = 0.02 / math.sqrt(2 * n_layer) if name.endswith("c_proj.weight") or name.endswith(
                    "mlp.proj.weight") else 0.02
                nn.init.normal_(p, 0.0, std)

    def forward(self, idx: Tensor) -> Tensor:
        x = self.transformer.emb(idx)
        for block in self.transformer.h:
            x = block(x)
        return self.transformer.head(x)


def fused_blocks(model: nn.Module) -> list[nn.Module]:
    """[embeddings, each block, final norm + head]: running them in sequence is ``model.forward``."""
    assert isinstance(model, FusedGPT), type(model)
    t = model.transformer
    return [t.emb, *t.h, t.head]


def interleave_qkv(weight: Tensor, tp: int) -> Tensor:
    """Rows of a fused [q; k; v] projection reordered to [q_0 k_0 v_0 | q_1 k_1 v_1 | ...] where
    ``*_r`` is rank r's contiguous share of heads: a column-wise (row-of-weight) shard in ``tp``
    equal pieces then gives each rank whole heads of q, k and v, in the q, k, v order its forward
    splits. (A plain column-wise shard of [q; k; v] would give rank 0 all of q and part of k.)"""
    three_d, d_in = weight.shape
    d = three_d // 3
    return weight.view(3, tp, d // tp, d_in).transpose(0, 1).reshape(three_d, d_in)


def fused_tensor_parallel(model: nn.Module, mesh, *, plan: str = "sp", **options):
    """Tensor-parallelize :class:`FusedGPT` in place, in the harness's plan contract: ``plan`` is
    ``"megatron"`` or ``"sp"``; returns the context the loss must run under, or None.

    Both plans split every block Megatron style: ``c_attn`` (after :func:`interleave_qkv`, so each
    rank owns whole heads of q, k and v) and ``mlp.fc`` column-wise, ``c_proj`` and ``mlp.proj``
    row-wise; each attention's ``n_head``/``n_embd`` become the local counts, which its forward
    reads. ``megatron``: embeddings, norms and head replicated, one all-reduce per sub-layer.
    ``sp`` (torchtitan's llama plan on this model's names): the residual stream and the norms are
    sharded along the sequence (reduce-scatter/all-gather instead of all-reduce), the head
    column-wise on the vocabulary and the loss computed on the vocabulary shards
    (``loss_parallel``). Other ``options`` are not this plan's and are ignored."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        PrepareModuleOutput,
        RowwiseParallel,
        SequenceParallel,
        loss_parallel,
        parallelize_module,
    )

    del options
    if plan not in ("sp", "megatron"):
        raise ValueError(f"fused_tensor_parallel: plan {plan!r} unknown; use sp or megatron")
    tp = mesh.size()
    blocks = list(model.transformer.h)
    if not blocks:
        raise ValueError("fused_tensor_parallel: the model has no transformer.h blocks to split")
    if plan == "megatron":
        layer = {"attn.c_attn": ColwiseParallel(), "attn.c_proj": RowwiseParallel(),
                 "mlp.fc": ColwiseParallel(), "mlp.proj": RowwiseParallel()}
    else:
        gather = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
        layer = {"ln_1": SequenceParallel(), "attn": gather,
                 "attn.c_attn": ColwiseParallel(), "attn.c_proj": RowwiseParallel(output_layouts=Shard(1)),
                 "ln_2": SequenceParallel(), "mlp": gather,
                 "mlp.fc": ColwiseParallel(), "mlp.proj": RowwiseParallel(output_layouts=Shard(1))}
    for block in blocks:
        attn = block.attn
        if attn.n_head % tp:
            raise ValueError(f"{attn.n_head} heads do not divide by tensor-parallel degree {tp}")
        with torch.no_grad():
            attn.c_attn.weight.copy_(interleave_qkv(attn.c_attn.weight, tp))
        parallelize_module(block, mesh, layer)
        attn.n_head //= tp
        attn.n_embd //= tp
    if plan == "megatron":
        return None
    # The embeddings stay replicated (small); their output is sliced along the sequence for the
    # first block's sequence-parallel norm.
    parallelize_module(model.transformer.emb, mesh, PrepareModuleOutput(
        output_layouts=(Replicate(),), desired_output_layouts=(Shard(1),), use_local_output=True))
    parallelize_module(model.transformer.head, mesh, {
        "ln_f": SequenceParallel(),
        "lm_head": ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False),
    })
    return loss_parallel


def fused_gpt(*, seed: int = 0, vocab: int = 128, seq_len: int = 16, d_model: int = 32, n_head: int = 4,
              n_layer: int = 6, global_batch: int = 8) -> Workload:
    """A nanoGPT-style decoder with fused qkv, no biases, and its own tensor-parallel plan."""
    _check_dims(d_model, n_head, n_layer, global_batch)
    d, t = d_model, seq_len
    matmul = n_layer * 12 * d * d + d * vocab
    params = matmul + vocab * d + t * d + n_layer * 2 * d + d  # + embeddings, LayerNorm weights
    return Workload(
        name="fused-gpt",
        build=lambda device: build_on(device, seed, lambda: FusedGPT(vocab, t, d, n_head, n_layer)),
        batch=_token_batches(seed, vocab, t, global_batch),
        loss=_token_loss,
        global_batch=global_batch,
        flops_per_sample=float((6 * matmul + 12 * n_layer * d * t) * t),
        blocks=fused_blocks,
        n_blocks=n_layer + 2,
        n_heads=n_head,
        params=params,
        tp_plan=fused_tensor_parallel,
        description=f"nanoGPT-style GPT, fused qkv, no biases, d={d} L={n_layer} H={n_head} T={t} V={vocab}, "
                    f"{params / 1e6:.2f}M params (foreign model)",
    )


# --------------------------------------------------------------------------------------------
# Controls: variants that must NOT pass, so that the checks above are known to bite
# --------------------------------------------------------------------------------------------


def naive_fused_tensor_parallel(model: nn.Module, mesh, **options) -> None:
    """A wrong plan on purpose: ``c_attn`` split column-wise as it is, without
    :func:`interleave_qkv`, so rank 0 gets all of q and half of k at world size 2. It runs, it
    communicates and it shards; only parity can tell that the model it trains is a different one."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    del options
    tp = mesh.size()
    plan = {"attn.c_attn": ColwiseParallel(), "attn.c_proj": RowwiseParallel(),
            "mlp.fc": ColwiseParallel(), "mlp.proj": RowwiseParallel()}
    for block in model.transformer.h:
        parallelize_module(block, mesh, plan)
        block.attn.n_head //= tp
        block.attn.n_embd //= tp


def fused_gpt_naive_qkv(**dims: int) -> Workload:
    """:func:`fused_gpt` under the wrong plan :func:`naive_fused_tensor_parallel` (a control)."""
    return dataclasses.replace(fused_gpt(**dims), name="fused-gpt-naive-qkv", tp_plan=naive_fused_tensor_parallel)


def tied_gpt(*, seed: int = 0, vocab: int = 128, seq_len: int = 16, d_model: int = 32, n_head: int = 4,
             n_layer: int = 6, global_batch: int = 8) -> Workload:
    """:func:`fused_gpt` with nanoGPT's weight tying (``lm_head.weight is wte.weight``), the way
    nanoGPT ships. One parameter then lives in the first and in the last block, which a harness that
    cuts the model into stages or FSDP units must handle (or refuse)."""

    def ctor() -> nn.Module:
        m = FusedGPT(vocab, seq_len, d_model, n_head, n_layer)
        m.transformer.head.lm_head.weight = m.transformer.emb.wte.weight
        return m

    wl = fused_gpt(seed=seed, vocab=vocab, seq_len=seq_len, d_model=d_model, n_head=n_head, n_layer=n_layer,
                   global_batch=global_batch)
    assert wl.params is not None
    return dataclasses.replace(wl, name="tied-gpt", build=lambda device: build_on(device, seed, ctor),
                               params=wl.params - vocab * d_model,
                               description=wl.description.replace("no biases", "no biases, tied embedding"))


def split_nothing_plan(model: nn.Module, mesh, **options) -> None:
    """A plan that matches none of the model's modules (as the built-in GPT's plan did on a user's
    model before plans belonged to workloads): it returns without splitting anything."""
    del model, mesh, options


def encoder_stack_inert_plan(**dims: int) -> Workload:
    """:func:`encoder_stack` with a tensor-parallel plan that splits nothing (a control): tensor
    parallel cells then run a whole replica per rank and must not be reported ok."""
    return dataclasses.replace(encoder_stack(**dims), name="encoder-stack-inert-plan", tp_plan=split_nothing_plan)


# --------------------------------------------------------------------------------------------
# Small image classifiers with a normalisation layer, as a user writes one (docs/guides/own-model.md):
# BatchNorm normalises over the batch a rank sees, so under data parallelism each rank's statistics
# differ from one device's by design; GroupNorm normalises within each sample, so they do not.

def _norm_cnn(name: str, norm, *, seed: int, global_batch: int) -> Workload:
    def make() -> nn.Module:
        return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), norm(8), nn.ReLU(),
                             nn.Conv2d(8, 8, 3, padding=1), norm(8), nn.ReLU(),
                             nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10))

    def batch(step: int) -> Batch:
        g = seeded(seed, step)
        return torch.randn(global_batch, 3, 8, 8, generator=g), torch.randint(0, 10, (global_batch,), generator=g)

    return Workload(name=name, build=lambda device: build_on(device, seed, make), batch=batch,
                    loss=F.cross_entropy, global_batch=global_batch, n_blocks=9,
                    description=f"a CNN with {norm.__name__} (foreign model)")


def batchnorm_cnn(*, seed: int = 0, global_batch: int = 16) -> Workload:
    return _norm_cnn("batchnorm-cnn", nn.BatchNorm2d, seed=seed, global_batch=global_batch)


def groupnorm_cnn(*, seed: int = 0, global_batch: int = 16) -> Workload:
    return _norm_cnn("groupnorm-cnn", lambda c: nn.GroupNorm(2, c), seed=seed, global_batch=global_batch)
