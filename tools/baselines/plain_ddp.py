"""A plain DistributedDataParallel training loop, written the way the PyTorch DDP docs write one,
outside the harness. It trains the same model on the same batches as parbench (each rank its
contiguous share of the global batch), so the harness's ``ddp`` step time can be checked against it:

    torchrun --nproc-per-node 2 -m tools.baselines.plain_ddp --workload gpt-200m --steps 30 --warmup 5
    torchrun --nproc-per-node 2 -m tools.baselines.plain_ddp --bucket-mb 100 --grad-as-bucket-view --static-graph
    python -m tools.baselines.plain_ddp --workload gpt-200m --no-ddp          # plain single GPU

    torchrun --nproc-per-node 2 -m tools.baselines.plain_ddp --optimizer adamw --compile --ac selective

Options (DDP's own knobs; defaults are DDP's defaults): ``--bucket-mb`` (bucket_cap_mb, 25),
``--grad-as-bucket-view`` (gradients alias the all-reduce buckets: saves a copy and memory),
``--static-graph`` (the graph is the same every step, so DDP can skip per-step bookkeeping).
Source: https://docs.pytorch.org/docs/stable/generated/torch.nn.parallel.DistributedDataParallel.html
and https://docs.pytorch.org/docs/stable/notes/ddp.html.

Training knobs (``_common.add_training_flags``, the harness's defaults): ``--optimizer`` (adamw),
``--ac none|full|selective`` (each transformer block checkpointed, ``_common.apply_ac``) and
``--compile``, applied in that order: checkpointing, DDP, then compilation of the whole model, on one
device ``model.compile()`` and under DDP ``torch.compile(ddp_model)``, whose graph dynamo splits
at DDP's bucket boundaries (its default ``optimize_ddp``) so that the all-reduces still overlap
backward. Source: https://docs.pytorch.org/docs/stable/notes/ddp.html (TorchDynamo DDPOptimizer).

Prints one JSON line (see ``_common.report``); ``loss_final`` is the global-batch loss of the
last step.
"""

from __future__ import annotations

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from tools.baselines import _common as c


def main() -> None:
    ap = c.parser(__doc__.splitlines()[0])
    ap.add_argument("--no-ddp", action="store_true", help="one process, no process group, no DDP")
    ap.add_argument("--bucket-mb", type=float, default=25.0, help="DDP bucket_cap_mb (DDP default 25)")
    ap.add_argument("--grad-as-bucket-view", action="store_true", help="DDP gradient_as_bucket_view")
    ap.add_argument("--static-graph", action="store_true", help="DDP static_graph")
    c.add_training_flags(ap)
    args = ap.parse_args()
    use_ddp = not args.no_ddp
    env, wl = c.setup(args, distributed=use_ddp)

    model = wl.build(env.device)
    ac_blocks = c.apply_ac(model, wl, args.ac)
    if use_ddp:
        ids = [env.device.index] if env.device.type == "cuda" else None
        model = DDP(model, device_ids=ids, bucket_cap_mb=args.bucket_mb,
                    gradient_as_bucket_view=args.grad_as_bucket_view, static_graph=args.static_graph)
        if args.compile:
            model = torch.compile(model)  # the DDP module compiled: dynamo's DDPOptimizer splits at buckets
    elif args.compile:
        model.compile()  # in place: the module keeps its type and parameters
    opt = c.optimizer(model.parameters(), args.optimizer, args.lr, env.device)
    data = c.batches(wl, args.warmup + args.steps, env, share=True)

    def step(i: int):
        x, y = data[i]
        with c.autocast(env, args.precision):
            out = model(x)
        loss = wl.loss(out, y)
        loss.backward()  # DDP all-reduces gradient buckets during backward
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    timed = c.train(step, warmup=args.warmup, steps=args.steps, env=env)
    final = c.global_mean(timed.loss, env)
    settings = ({"bucket_mb": args.bucket_mb, "gradient_as_bucket_view": args.grad_as_bucket_view,
                 "static_graph": args.static_graph} if use_ddp else {})
    c.report("plain-ddp" if use_ddp else "plain-single", args, env, wl, timed, final, ac_blocks=ac_blocks,
             **settings)
    c.teardown(env)


if __name__ == "__main__":
    main()
