"""A GPT-style decoder-only transformer in named sizes, trained on synthetic next-token data."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from bench.workloads.base import Workload, display_name, init_by_name, seeded


@dataclass(frozen=True, kw_only=True)
class GPTConfig:
    vocab: int
    seq_len: int
    d_model: int
    n_layer: int
    n_head: int
    global_batch: int

    @property
    def d_ff(self) -> int:
        return 4 * self.d_model


SIZES: dict[str, GPTConfig] = {
    "gpt-tiny": GPTConfig(vocab=256, seq_len=32, d_model=64, n_layer=2, n_head=4, global_batch=8),
    "gpt-small": GPTConfig(vocab=4096, seq_len=128, d_model=256, n_layer=4, n_head=8, global_batch=16),
    "gpt-50m": GPTConfig(vocab=16384, seq_len=512, d_model=512, n_layer=12, n_head=8, global_batch=16),
    # 16 layers of d=1024: 201.4M in blocks, 236M with embeddings and head.
    "gpt-200m": GPTConfig(vocab=16384, seq_len=1024, d_model=1024, n_layer=16, n_head=16,
                          global_batch=16),
    # 44 layers of d=6144: 20.3B parameters, whose fp32 values and gradients alone (8 bytes a
    # parameter; AdamW's state adds 8 more) take 163 GB: more than one H100 or H200 holds.
    # Only the strategies that cut the model (FSDP, tensor parallel, the pipelines) run it, each rank
    # allocating its part; n_layer scales it to the machine (layers_beyond).
    "gpt-20b": GPTConfig(vocab=32768, seq_len=1024, d_model=6144, n_layer=44, n_head=48, global_batch=8),
}


class Attention(nn.Module):
    """Causal self-attention with one fused q/k/v projection and no biases, as nanoGPT has it (one
    matrix product instead of three: at d=1024 a GPT written so trained 9% faster on one H100 than
    one with separate, biased q, k and v projections). Unlike nanoGPT's q|k|v split, the
    projection's output is laid out head by head,
    each head's q, k and v side by side, so a column-wise tensor-parallel shard of it holds whole
    heads; the head count is read off the output width at run time, so such a shard (fewer local
    heads) runs unchanged."""

    def __init__(self, d: int, n_head: int):
        super().__init__()
        self.head_dim = d // n_head
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.o = nn.Linear(d, d, bias=False)

    def heads(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """q, k and v of ``x`` (B, T, d), each (B, heads, T, head_dim)."""
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, -1, 3, self.head_dim).unbind(3)
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

    def forward(self, x: Tensor) -> Tensor:
        b, t, _ = x.shape
        y = F.scaled_dot_product_attention(*self.heads(x), is_causal=True)
        return self.o(y.transpose(1, 2).reshape(b, t, -1))


class MLP(nn.Module):
    def __init__(self, d: int, d_ff: int):
        super().__init__()
        self.up = nn.Linear(d, d_ff, bias=False)
        self.down = nn.Linear(d_ff, d, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down(F.gelu(self.up(x)))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model, bias=False)
        self.attn = Attention(cfg.d_model, cfg.n_head)
        self.ln2 = nn.LayerNorm(cfg.d_model, bias=False)
        self.mlp = MLP(cfg.d_model, cfg.d_ff)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class Embed(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.tok = nn.Embedding(cfg.vocab, cfg.d_model)
        self.pos = nn.Embedding(cfg.seq_len, cfg.d_model)

    def forward(self, idx: Tensor) -> Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        return self.tok(idx) + self.pos(pos)


class Head(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln = nn.LayerNorm(cfg.d_model, bias=False)
        self.out = nn.Linear(cfg.d_model, cfg.vocab, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.out(self.ln(x))


class GPT(nn.Sequential):
    """Embed, n_layer blocks, head: a sequence, so pipeline strategies can cut it anywhere. Its
    parameters get their values from :func:`init_params`."""

    def __init__(self, cfg: GPTConfig):
        super().__init__(Embed(cfg), *[Block(cfg) for _ in range(cfg.n_layer)], Head(cfg))


def init_params(model: nn.Module, seed: int, n_layer: int) -> None:
    """Give every parameter of ``model`` off the meta device its value (:func:`bench.workloads.base.init_by_name`):
    matrices (embeddings included) normal with std 0.02, the residual projections' (attention
    output, MLP down) 0.02/sqrt(2 n_layer), as GPT-2 has it; norm weights 1."""
    residual = 0.02 / math.sqrt(2 * n_layer)
    init_by_name(model, seed, std=lambda name: residual if name.endswith(("o.weight", "down.weight")) else 0.02,
                 vector=lambda name: 1.0)


def build_gpt(cfg: GPTConfig, seed: int, device: torch.device) -> GPT:
    """The model on ``device`` with its values (on the meta device: shapes only)."""
    with torch.device("meta"):
        model = GPT(cfg)
    if device.type != "meta":
        model.to_empty(device=device)
        init_params(model, seed, cfg.n_layer)
    return model


def tensor_parallel(model: nn.Module, mesh, *, plan: str = "sp", **_options):
    """Tensor-parallelize the GPT in place; returns the context the loss must run under (loss
    parallel), or None.

    ``plan="megatron"``: Megatron-style blocks: the fused q/k/v and the MLP's up projection
    column-wise (each rank owns whole heads, their q, k and v, and some hidden units), the attention
    output and the MLP's down projection row-wise: one all-reduce per sub-layer in forward and one
    in backward; embedding, norms and head replicated.

    ``plan="sp"`` (default), as torchtitan's llama plan: the same column/row split, with sequence
    parallelism between the sub-layers (norms and the residual stream sharded along the sequence:
    each all-reduce becomes a reduce-scatter plus an all-gather of the same total volume, and the
    norms compute on 1/tp of the tokens), the head column-wise on the vocabulary and the loss
    computed on the vocabulary shards (``loss_parallel``: the logits are never gathered). The
    embedding (token + position, small) stays replicated; its output is sliced along the sequence.
    """
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

    if plan not in ("sp", "megatron"):
        raise ValueError(f"tensor-parallel plan {plan!r} unknown; use sp or megatron")
    blocks = [m for m in model.modules() if isinstance(m, Block)]
    if plan == "megatron":
        layer = {"attn.qkv": ColwiseParallel(), "attn.o": RowwiseParallel(), "mlp.up": ColwiseParallel(),
                 "mlp.down": RowwiseParallel()}
        for block in blocks:
            parallelize_module(block, mesh, layer)
        return None
    layer = {
        "ln1": SequenceParallel(),
        "attn": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        "attn.qkv": ColwiseParallel(),
        "attn.o": RowwiseParallel(output_layouts=Shard(1)),
        "ln2": SequenceParallel(),
        "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        "mlp.up": ColwiseParallel(),
        "mlp.down": RowwiseParallel(output_layouts=Shard(1)),
    }
    for block in blocks:
        parallelize_module(block, mesh, layer)
    embed = next(m for m in model.modules() if isinstance(m, Embed))
    head = next(m for m in model.modules() if isinstance(m, Head))
    parallelize_module(embed, mesh, PrepareModuleOutput(output_layouts=(Replicate(),),
                                                        desired_output_layouts=(Shard(1),), use_local_output=True))
    parallelize_module(head, mesh, {
        "ln": SequenceParallel(),
        "out": ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False),
    })
    return loss_parallel


def n_params(cfg: GPTConfig) -> int:
    """Every parameter: the matrices, token and position embeddings, two norm weights a block and
    the head's norm."""
    return (matmul_params(cfg) + cfg.vocab * cfg.d_model + cfg.seq_len * cfg.d_model
            + cfg.n_layer * 2 * cfg.d_model + cfg.d_model)


def layers_beyond(device_bytes: int, size: str = "gpt-20b", margin: float = 1.15, bytes_per_param: int = 8) -> int:
    """The fewest layers of ``size`` whose training state (``bytes_per_param``: 8 for fp32
    parameters and gradients, 16 with AdamW's two fp32 values besides) takes ``margin`` times
    ``device_bytes`` or more: a model that cannot train on one such device whatever its batch, and
    fits, cut in parts, on a few."""
    rest = n_params(dataclasses.replace(SIZES[size], n_layer=0))
    per_layer = n_params(dataclasses.replace(SIZES[size], n_layer=1)) - rest
    return max(1, math.ceil((margin * device_bytes / bytes_per_param - rest) / per_layer))


def matmul_params(cfg: GPTConfig) -> int:
    """Parameters that take part in matrix products (all Linear weights, the head included)."""
    d, f = cfg.d_model, cfg.d_ff
    return cfg.n_layer * (4 * d * d + 2 * d * f) + d * cfg.vocab


def flops_per_sample(cfg: GPTConfig) -> float:
    """Training FLOPs per sequence: 6N per token over the matmul weights, plus the attention term
    (QK^T and AV: 2 matmuls of 2*T*d flops a token each forward, x3 for forward+backward).
    Causal masking is not discounted, as in the PaLM paper's MFU convention."""
    t = cfg.seq_len
    per_token = 6 * matmul_params(cfg) + 12 * cfg.n_layer * cfg.d_model * t
    return float(per_token * t)


def make(*, size: str = "gpt-tiny", seed: int = 0, **dims: int) -> Workload:
    """A GPT workload; ``dims`` override fields of the named size (vocab, seq_len, d_model,
    n_layer, n_head, global_batch)."""
    base = SIZES[size]
    unknown = set(dims) - set(GPTConfig.__dataclass_fields__)
    if unknown:
        raise TypeError(f"unknown GPT dimension(s) {sorted(unknown)}; "
                        f"known: {sorted(GPTConfig.__dataclass_fields__)}")
    cfg = GPTConfig(**{**base.__dict__, **dims})
    if cfg.d_model % cfg.n_head:
        raise TypeError(f"d_model={cfg.d_model} does not divide by n_head={cfg.n_head}")

    def batch(step: int):
        tokens = torch.randint(0, cfg.vocab, (cfg.global_batch, cfg.seq_len + 1), generator=seeded(seed, step))
        return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()

    def loss(logits: Tensor, target: Tensor) -> Tensor:
        return F.cross_entropy(logits.float().flatten(0, 1), target.flatten())

    params = n_params(cfg)
    return Workload(
        name=display_name(size, dims),
        build=lambda device: build_gpt(cfg, seed, device),
        init=lambda model: init_params(model, seed, cfg.n_layer),
        batch=batch,
        loss=loss,
        global_batch=cfg.global_batch,
        flops_per_sample=flops_per_sample(cfg),
        n_blocks=cfg.n_layer + 2,
        n_heads=cfg.n_head,
        params=params,
        tp_plan=tensor_parallel,
        description=f"decoder transformer d={cfg.d_model} L={cfg.n_layer} H={cfg.n_head} T={cfg.seq_len} "
                    f"V={cfg.vocab}, {params / 1e6:.1f}M params",
    )
