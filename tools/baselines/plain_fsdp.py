"""A plain FSDP2 (``fully_shard``) training loop, configured the way torchtitan configures llama,
outside the harness:

    torchrun --nproc-per-node 2 -m tools.baselines.plain_fsdp --workload gpt-200m --steps 30 --warmup 5
    torchrun --nproc-per-node 4 -m tools.baselines.plain_fsdp --no-mp          # fp32 params under autocast
    torchrun --nproc-per-node 4 -m tools.baselines.plain_fsdp --no-reshard     # keep params gathered

Configuration, after torchtitan's ``apply_fsdp`` (torchtitan/models/llama3/parallelize.py) except where noted:

- ``fully_shard`` on every transformer block, then on the root (the root unit holds the embedding
  and the head, which for our ``nn.Sequential`` GPT are the first and last children). torchtitan's
  current ``apply_fsdp`` also makes the embedding a unit (resharded after forward) and the final
  norm with the head another (not resharded by default); this loop keeps both in the root, which
  FSDP2 does not reshard after forward.
- ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)`` when precision is bf16: FSDP
  all-gathers bf16 parameters and the blocks compute in bf16 with no autocast; gradients are
  reduce-scattered in fp32. ``--no-mp`` keeps fp32 parameters and wraps forward in bf16 autocast
  (the harness's ``fsdp`` with ``--option fsdp_mp=off``).
- ``reshard_after_forward=True`` on every block except the last, which backward needs first
  ("FSDP would prefetch it immediately"); ``--no-reshard`` keeps every block gathered from forward
  to backward (ZeRO-2 like: less communication, more memory).
- Implicit prefetching (FSDP2's default), as torchtitan does for dense models.
- The training knobs (``_common.add_training_flags``), in torchtitan's order: activation
  checkpointing of each block (``--ac full|selective``, ``_common.apply_ac``), then each block
  compiled on its own (``--compile``: ``block.compile()``, in place; ``fully_shard`` then wraps
  the compiled block, and its hooks, which dynamo does not trace, all-gather and reduce-scatter
  outside the graphs), then
  ``fully_shard``; the optimizer (``--optimizer``, default adamw as the harness) over the sharded
  DTensor parameters, so its state is sharded as well.

Sources: https://docs.pytorch.org/docs/stable/distributed.fsdp.fully_shard.html,
https://github.com/pytorch/torchtitan/blob/main/docs/fsdp.md and torchtitan's
``apply_fsdp`` / ``torchtitan/distributed/fsdp.py``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from tools.baselines import _common as c


def add_flags(ap) -> None:
    ap.add_argument("--no-mp", action="store_true",
                    help="no MixedPrecisionPolicy: fp32 parameters, bf16 autocast around forward")
    ap.add_argument("--no-reshard", action="store_true", help="reshard_after_forward=False on every block")
    c.add_training_flags(ap)


def build(args, env: c.Env, wl) -> tuple[Callable[[int], torch.Tensor], dict[str, object]]:
    """The sharded model, its optimizer and batches: ``step(i)`` trains on batch i and returns the
    loss; the settings are those the JSON line records."""
    mesh = init_device_mesh(env.device.type, (env.world,))
    model = wl.build(env.device)
    mp = args.precision == "bf16" and not args.no_mp
    policy = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if mp
              else MixedPrecisionPolicy())
    ac_blocks = c.apply_ac(model, wl, args.ac)  # AC, then compile, then fully_shard (torchtitan's order)
    blocks = c.transformer_blocks(wl, model)  # the checkpoint wrappers, with --ac
    if args.compile:
        for block in blocks:
            block.compile()  # in place: one graph per block; FSDP2's hooks stay eager (dynamo-disabled)
    for k, block in enumerate(blocks):
        # The last block is the first one backward needs: resharding it would be undone at once.
        reshard = not args.no_reshard and k < len(blocks) - 1
        fully_shard(block, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard)
    fully_shard(model, mesh=mesh, mp_policy=policy, reshard_after_forward=not args.no_reshard)
    opt = c.optimizer(model.parameters(), args.optimizer, args.lr, env.device)
    data = c.batches(wl, args.warmup + args.steps, env, share=True)
    # With the policy FSDP casts parameters itself; autocast is only for fp32 parameters.
    precision = "fp32" if mp else args.precision

    def step(i: int):
        x, y = data[i % len(data)]
        with c.autocast(env, precision):
            out = model(x)
        loss = wl.loss(out, y)
        loss.backward()  # reduce-scatters gradients block by block
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    return step, dict(mixed_precision_policy=mp, param_dtype="bf16" if mp else "fp32", reduce_dtype="fp32",
                      autocast=precision == "bf16", reshard_after_forward=not args.no_reshard,
                      fsdp_units=len(blocks) + 1, ac_blocks=ac_blocks,
                      compiled_blocks=len(blocks) if args.compile else 0)


def main() -> None:
    ap = c.parser(__doc__.splitlines()[0])
    add_flags(ap)
    args = ap.parse_args()
    env, wl = c.setup(args)
    step, settings = build(args, env, wl)
    timed = c.train(step, warmup=args.warmup, steps=args.steps, env=env)
    c.report("plain-fsdp", args, env, wl, timed, c.global_mean(timed.loss, env), **settings)
    c.teardown(env)


if __name__ == "__main__":
    main()
