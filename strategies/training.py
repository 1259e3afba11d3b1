"""How a strategy applies the training knobs (bench.core.knobs) to its model, in torchtitan's order:
the tensor-parallel plan first, then activation checkpointing per block, then torch.compile (per
block, per stage or the whole module), then FSDP2's ``fully_shard``; and the optimizer over the
parameters the rank holds.

* :func:`make_optimizer`: AdamW (fused on CUDA, fp32 state), Adam or SGD over this rank's
  parameters; a DTensor parameter's state is a DTensor of its shard, so FSDP2 and the 2D meshes
  keep sharded state and DDP whole state, as they do in practice.
* :func:`checkpoint_blocks`: each inner block's forward under ``torch.utils.checkpoint`` (non-reentrant):
  "full" recomputes the whole block in backward; "selective" saves the outputs of matrix products
  and attention and recomputes the rest (torchtitan's op-level selective checkpointing). The block
  stays the same module object, with the same parameter names and hooks, so FSDP2, the pipeline
  split and a workload's ``init`` see the model they would see without it.
* :func:`compile_blocks` / :func:`compile_module`: ``nn.Module.compile`` in place (regional
  compilation per block, as torchtitan does), or the whole module; :func:`compiled_loss`: the
  workload's loss function compiled too, as torchtitan compiles it.
"""

from __future__ import annotations

import dataclasses
import functools

import torch
from torch import nn
from torch._dynamo.comptime import comptime
from torch.distributed.tensor import DTensor
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from bench.workloads import Workload
from strategies.base import Context

#: ops whose outputs selective checkpointing keeps (matrix products and attention: the expensive
#: ones to recompute); the rest of a block (norms, activations, elementwise) is recomputed
_SAVED_OPS = ("mm", "addmm", "bmm", "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
              "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu")


def make_optimizer(params, ctx: Context) -> torch.optim.Optimizer:
    """The cell's optimizer (``ctx.training.optimizer``) over ``params`` at ``ctx.lr``: AdamW or
    Adam with torch's default betas, eps and weight decay, fused on CUDA (one kernel for every
    parameter's update), SGD without momentum.

    DTensor and plain parameters go in separate groups: the multi-tensor (foreach) and fused
    updates refuse a list that mixes them (tensor parallel leaves norms and embeddings as plain
    tensors)."""
    params = list(params)
    groups = [{"params": g} for g in ([p for p in params if isinstance(p, DTensor)],
                                      [p for p in params if not isinstance(p, DTensor)]) if g]
    return optimizer_class(ctx.training.optimizer)(groups, **optimizer_kwargs(ctx))


def optimizer_class(name: str) -> type[torch.optim.Optimizer]:
    """The torch optimizer of a knob value."""
    return {"adamw": torch.optim.AdamW, "adam": torch.optim.Adam, "sgd": torch.optim.SGD}[name]


def optimizer_kwargs(ctx: Context) -> dict:
    """The optimizer's settings besides its parameters (ZeroRedundancyOptimizer passes them on)."""
    kw: dict = {"lr": ctx.lr}
    if ctx.training.optimizer != "sgd" and ctx.device.type == "cuda":
        kw["fused"] = True
    return kw


def inner_blocks(wl: Workload, model: nn.Module) -> list[nn.Module]:
    """The workload's pieces that hold parameters, without the first and last (for a GPT: the
    transformer blocks, not the embedding and the head) when there are at least three pieces:
    the blocks FSDP2 shards one by one, activation checkpointing wraps and compile compiles."""
    pieces = wl.blocks(model)
    if len(pieces) >= 3:
        pieces = pieces[1:-1]
    return [b for b in pieces if any(True for _ in b.parameters())]


def _selective_policy(ctx, op, *args, **kwargs):
    name = getattr(op, "_overloadpacket", op).__name__
    return CheckpointPolicy.MUST_SAVE if name in _SAVED_OPS else CheckpointPolicy.PREFER_RECOMPUTE


#: forwards run under checkpointing in this process since :func:`reset_counts` (under compile, the
#: traced ones): the evidence that a cell asking for it got it
_COUNTS = {"checkpointed": 0}


def _count() -> None:
    _COUNTS["checkpointed"] += 1


def reset_counts() -> None:
    """Start counting a new cell's checkpointed forwards."""
    _COUNTS["checkpointed"] = 0


def checkpointed_forwards() -> int:
    """Forwards run (or traced) under activation checkpointing since :func:`reset_counts`."""
    return _COUNTS["checkpointed"]


def _checkpointed(forward, ac: str, *args, **kwargs):
    # Counted when traced under compile (comptime runs at trace time, out of the graph): a count
    # dynamo read would be a guard on its value, failed by every call, so every step recompiled
    # until dynamo's recompile limit sent the block back to eager.
    comptime(lambda _ctx: _count(), fallback_fn=_count)
    if ac == "selective":
        context_fn = functools.partial(create_selective_checkpoint_contexts, _selective_policy)
        return checkpoint(forward, *args, use_reentrant=False, context_fn=context_fn, **kwargs)
    return checkpoint(forward, *args, use_reentrant=False, **kwargs)


def checkpoint_blocks(blocks: list[nn.Module], ac: str) -> None:
    """Activation checkpointing ``ac`` (none, full, selective) on each of ``blocks``, in place: the
    block's forward runs under ``torch.utils.checkpoint``, its hooks (FSDP2's all-gather) outside it."""
    if ac == "none":
        return
    for block in blocks:
        block.forward = functools.partial(_checkpointed, block.forward, ac)


def compile_blocks(blocks: list[nn.Module], ctx: Context) -> None:
    """Each of ``blocks`` compiled in place when the cell compiles (regional compilation)."""
    if ctx.training.compile == "on":
        for block in blocks:
            block.compile()


def compile_module(module: nn.Module, ctx: Context) -> nn.Module:
    """The whole ``module`` compiled when the cell compiles (a DDP-wrapped module compiles with
    dynamo's DDP optimizer: graphs split at DDP's bucket boundaries, so the all-reduces still
    overlap backward); ``module`` itself otherwise."""
    return torch.compile(module) if ctx.training.compile == "on" else module


def compiled_loss(wl: Workload, ctx: Context) -> Workload:
    """``wl`` with its loss compiled when the cell compiles (torchtitan compiles the loss beside the
    model): the cast of the logits and the cross entropy fuse instead of writing an fp32 copy of the
    logits to memory; ``wl`` itself otherwise."""
    if ctx.training.compile != "on":
        return wl
    return dataclasses.replace(wl, loss=torch.compile(wl.loss))


def prepare_blocks(wl: Workload, model: nn.Module, ctx: Context, *, compile_each: bool = True,
                   dtensor: bool = False) -> None:
    """Activation checkpointing, then (``compile_each``) compilation, on the model's inner blocks:
    the order torchtitan applies them in, after the tensor-parallel plan and before ``fully_shard``.
    A block of DTensor parameters (``dtensor``: after a tensor-parallel plan) that is both
    checkpointed and compiled has its forward compiled inside the checkpoint instead: dynamo's
    tracing of a checkpoint refuses the DTensors' device mesh among the saved values."""
    blocks = inner_blocks(wl, model)
    if dtensor and compile_each and ctx.training.compile == "on" and ctx.training.ac != "none":
        for block in blocks:
            block.forward = torch.compile(block.forward)
        checkpoint_blocks(blocks, ctx.training.ac)
        return
    checkpoint_blocks(blocks, ctx.training.ac)
    if compile_each:
        compile_blocks(blocks, ctx)


def whole_model(wl: Workload, model: nn.Module, ctx: Context) -> nn.Module:
    """``model`` as a strategy that keeps it whole trains it: activation checkpointing per block,
    then the whole module compiled (one device, a hand-written all-reduce, an ensemble member)."""
    prepare_blocks(wl, model, ctx, compile_each=False)
    return compile_module(model, ctx)
