"""A plain tensor-parallel training loop (``torch.distributed.tensor.parallel``), outside the harness:

    torchrun --nproc-per-node 2 -m tools.baselines.plain_tp                        # Megatron plan
    torchrun --nproc-per-node 4 -m tools.baselines.plain_tp --sequence-parallel    # + SP + loss parallel

Plan (``parallelize_module`` on each transformer block), as torchtitan's llama ``apply_tp``
(torchtitan/models/llama3/parallelize.py, 2025) and the PyTorch TP tutorial:

- the fused q/k/v projection and the MLP's up projection ``ColwiseParallel`` (the fused output is
  laid out head by head, so a column shard holds whole heads); the attention output and the MLP's
  down projection ``RowwiseParallel``. The built-in GPT attention reads the head count off the
  projection width, so each rank runs its local heads unchanged.
- Without ``--sequence-parallel`` (the Megatron plan): norms, embedding and head replicated; each
  row-wise projection ends in an all-reduce; activations between blocks are whole on every rank.
- With ``--sequence-parallel``: the LayerNorms are ``SequenceParallel`` (activations between
  sub-layers are sharded along the sequence, dim 1); ``PrepareModuleInput`` all-gathers the
  sequence before attention and the MLP (Shard(1) -> Replicate); the row-wise projections
  reduce-scatter back to Shard(1) instead of all-reducing. The head's norm is sequence parallel
  and its linear is column-wise from Shard(1) to vocabulary-sharded logits (Shard(-1)), and the loss
  is computed with ``loss_parallel()`` (cross-entropy on the sharded logits, no all-gather of
  the vocabulary), forward and backward inside the context, as torchtitan's train context does.
  ``--no-loss-parallel`` all-gathers the logits instead.
- Difference from torchtitan: its token embedding is row-wise (vocabulary sharded) with a
  reduce-scatter to Shard(1). The built-in GPT's embedding adds a position embedding inside the
  same module, so here the embedding stays replicated and its output is cut along the sequence
  with ``PrepareModuleOutput`` (Replicate -> Shard(1): a local slice, no communication).

Every rank sees the whole batch. bf16 autocast on CUDA, as the harness does.
Sources: https://docs.pytorch.org/docs/stable/distributed.tensor.parallel.html,
https://docs.pytorch.org/tutorials/intermediate/TP_tutorial.html, torchtitan ``apply_tp``.
"""

from __future__ import annotations

import contextlib

from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    PrepareModuleOutput,
    RowwiseParallel,
    SequenceParallel,
    loss_parallel,
    parallelize_module,
)

from tools.baselines import _common as c


def block_plan(sp: bool) -> dict:
    """The plan of one GPT ``Block`` (ln1, attn.{qkv,o}, ln2, mlp.{up,down}); the fused qkv is laid
    out head by head, so its column-wise shards hold whole heads."""
    plan = {"attn.qkv": ColwiseParallel(), "mlp.up": ColwiseParallel()}
    if not sp:
        return {**plan, "attn.o": RowwiseParallel(), "mlp.down": RowwiseParallel()}
    gather_seq = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
    return {"ln1": SequenceParallel(), "attn": gather_seq, **plan,
            "attn.o": RowwiseParallel(output_layouts=Shard(1)),
            "ln2": SequenceParallel(), "mlp": gather_seq,
            "mlp.down": RowwiseParallel(output_layouts=Shard(1))}


def apply_tp(model: nn.Module, mesh: DeviceMesh, *, sp: bool, loss_par: bool) -> None:
    """Parallelize ``model`` (nn.Sequential: Embed, blocks, Head) in place."""
    parts = list(model.children())
    for block in parts[1:-1]:
        parallelize_module(block, mesh, block_plan(sp))
    if sp:
        last = str(len(parts) - 1)
        parallelize_module(model, mesh, {
            "0": PrepareModuleOutput(output_layouts=Replicate(), desired_output_layouts=Shard(1)),
            f"{last}.ln": SequenceParallel(),
            f"{last}.out": ColwiseParallel(input_layouts=Shard(1),
                                           output_layouts=Shard(-1) if loss_par else Replicate(),
                                           use_local_output=not loss_par),
        })


def main() -> None:
    ap = c.parser(__doc__.splitlines()[0])
    ap.add_argument("--sequence-parallel", action="store_true",
                    help="SequenceParallel norms, reduce-scatter/all-gather, loss parallel (torchtitan)")
    ap.add_argument("--no-loss-parallel", action="store_true", help="with SP: all-gather the logits instead")
    args = ap.parse_args()
    env, wl = c.setup(args)
    sp, loss_par = args.sequence_parallel, args.sequence_parallel and not args.no_loss_parallel
    if wl.n_heads is not None and wl.n_heads % env.world:
        raise SystemExit(f"{wl.n_heads} heads do not divide by tensor-parallel degree {env.world}")
    x0, _ = wl.batch(0)
    if sp and x0.shape[1] % env.world:
        raise SystemExit(f"sequence parallel: sequence length {x0.shape[1]} does not divide by {env.world}")

    mesh = init_device_mesh(env.device.type, (env.world,))
    model = wl.build(env.device)
    apply_tp(model, mesh, sp=sp, loss_par=loss_par)
    opt = c.sgd(model.parameters(), args.lr)
    data = c.batches(wl, args.warmup + args.steps, env, share=False)

    def step(i: int):
        x, y = data[i]
        # loss_parallel covers the loss and its backward (the sharded cross-entropy's gradient).
        with loss_parallel() if loss_par else contextlib.nullcontext():
            with c.autocast(env, args.precision):
                out = model(x)
            loss = wl.loss(out, y)
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    timed = c.train(step, warmup=args.warmup, steps=args.steps, env=env)
    # Every rank holds the whole-batch loss (a replicated DTensor under loss parallel).
    loss = timed.loss
    final = float(loss.full_tensor() if isinstance(loss, DTensor) else loss)
    name = "plain-tp-sp" if sp else "plain-tp"
    c.report(name, args, env, wl, timed, final, sequence_parallel=sp, loss_parallel=loss_par,
             mesh=f"tp{env.world}")
    c.teardown(env)


if __name__ == "__main__":
    main()
