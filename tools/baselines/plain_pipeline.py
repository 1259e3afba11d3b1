"""A plain pipeline-parallel training loop with ``torch.distributed.pipelining``, outside the harness:

    torchrun --nproc-per-node 4 -m tools.baselines.plain_pipeline --schedule gpipe --micro-batches 8
    torchrun --nproc-per-node 4 -m tools.baselines.plain_pipeline --schedule 1f1b --micro-batches 8

One stage per rank (manual splitting, as the pipelining docs' "Option 1" and torchtitan do): the
transformer blocks are cut into equal runs, the embedding goes with the first stage and the head
with the last (``--split equal``). ``--split titan`` instead counts the embedding and the head as
one block each, as torchtitan's ``pipeline_parallel_first/last_stage_less_layers = 1`` default does.
Each rank builds the whole model from the seed (so every stage starts from the same weights as one
device would) and keeps its stage. Each global batch is cut into ``--micro-batches``; the schedule
scales gradients by 1/micro-batches (``scale_grads``), so the update is the one of the whole batch.
The schedule step runs under bf16 autocast on CUDA, as the harness does. ``return_outputs=False``
(torchtitan) spares the last stage merging the micro-batch logits; ``--return-outputs`` restores
the default.

Sources: https://docs.pytorch.org/docs/stable/distributed.pipelining.html and torchtitan's
``torchtitan/distributed/pipeline_parallel.py`` (``pipeline_llm``, ``_generate_llm_fqn_per_model_part``).
"""

from __future__ import annotations

import inspect

import torch
from torch import nn
from torch.distributed import all_reduce
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

from tools.baselines import _common as c

SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}


def split(n_blocks: int, stages: int, how: str) -> list[int]:
    """Transformer blocks per stage. ``equal``: n/stages each. ``titan``: the embedding and the head
    weigh one block each and the stages share n+2 units as evenly as possible, extras first."""
    if how == "equal":
        if n_blocks % stages:
            raise SystemExit(f"--split equal: {n_blocks} blocks do not divide into {stages} stages")
        return [n_blocks // stages] * stages
    units = n_blocks + 2
    base, extra = divmod(units, stages)
    per = [base + (i < extra) for i in range(stages)]
    per[0] -= 1
    per[-1] -= 1
    if min(per) < 1 and stages > 1:
        raise SystemExit(f"--split titan: {n_blocks} blocks are too few for {stages} stages")
    return per


def stage_module(model: nn.Module, rank: int, stages: int, per: list[int]) -> nn.Module:
    """This rank's part of ``model`` (an nn.Sequential of embedding, blocks, head), ``per[k]``
    blocks on stage k."""
    parts = list(model.children())
    embed, blocks, head = parts[0], parts[1:-1], parts[-1]
    start = sum(per[:rank])
    mods = ([embed] if rank == 0 else []) + blocks[start:start + per[rank]]
    return nn.Sequential(*mods, *([head] if rank == stages - 1 else []))


def main() -> None:
    ap = c.parser(__doc__.splitlines()[0])
    ap.add_argument("--schedule", choices=sorted(SCHEDULES), default="1f1b")
    ap.add_argument("--micro-batches", type=int, default=8)
    ap.add_argument("--split", choices=("equal", "titan"), default="equal")
    ap.add_argument("--return-outputs", action="store_true", help="let the last stage merge the outputs")
    args = ap.parse_args()
    env, wl = c.setup(args)
    if args.micro_batches < env.world or wl.global_batch % args.micro_batches:
        raise SystemExit(f"--micro-batches {args.micro_batches}: need >= {env.world} stages and a divisor "
                         f"of the global batch {wl.global_batch}")

    model = wl.build(env.device)
    per = split(len(list(model.children())) - 2, env.world, args.split)
    stage_mod = stage_module(model, env.rank, env.world, per)
    del model  # the other stages' blocks are freed
    first, last = env.rank == 0, env.rank == env.world - 1
    stage = PipelineStage(stage_mod, env.rank, env.world, env.device)
    schedule = SCHEDULES[args.schedule](stage, n_microbatches=args.micro_batches, loss_fn=wl.loss)
    opt = c.sgd(stage_mod.parameters(), args.lr)
    # Only the first stage reads tokens and only the last reads targets.
    data = c.batches(wl, args.warmup + args.steps, env, share=False, need_x=first, need_y=last)
    # return_outputs appeared in torch 2.8; older schedules always merge.
    extra = ({"return_outputs": args.return_outputs}
             if "return_outputs" in inspect.signature(schedule.step).parameters else {})

    def step(i: int):
        x, y = data[i]
        losses: list[torch.Tensor] = []
        with c.autocast(env, args.precision):
            schedule.step(*((x,) if first else ()), **({"target": y, "losses": losses} if last else {}),
                          **extra)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return torch.stack(losses).mean().detach() if last else None

    timed = c.train(step, warmup=args.warmup, steps=args.steps, env=env)
    # Only the last stage has the loss; a sum over ranks (zeros elsewhere) brings it to rank 0.
    dev = env.device if env.backend == "nccl" else torch.device("cpu")
    total = timed.loss.float().reshape(1).to(dev) if last else torch.zeros(1, device=dev)
    all_reduce(total)
    c.report(f"plain-pipeline-{args.schedule}", args, env, wl, timed, float(total), schedule=args.schedule,
             micro_batches=args.micro_batches, split=args.split,
             blocks_per_stage=per,
             return_outputs=bool(extra.get("return_outputs", True)))
    c.teardown(env)


if __name__ == "__main__":
    main()
