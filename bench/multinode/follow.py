"""A node other than node 0: run the launches node 0 sends, ship telemetry and errors back.

The node samples its own host and GPUs all along (node 0 puts the rows in ``samples.parquet`` with
this node's number). For each launch it starts its part of the group (torchrun with this node's
share of the processes, the same c10d rendezvous), forwards its ranks' error events, and reports
how its part ended (exit code, crash reason, processes it had to kill). It stops its part when
node 0 says so (node 0 timed out a cell or its own part ended), and stops altogether when node 0
ends the run or stops answering. Its work files (plans, logs, event files) stay in
``OUT/<run-id>/work/node<R>/`` on this machine.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from pathlib import Path

from bench.core import spec
from bench.measure.telemetry import start_samplers
from bench.multinode import NodeLost
from bench.multinode.nodes import PUSH_S, Follower
from bench.runtime.process import Launch, become_subreaper, child_env
from bench.runtime.signals import check_stop

log = logging.getLogger("parbench")


def follow(cfg, digest: str, n_cells: int, *, on_progress=None, module: str) -> Path:
    """Join node 0's run and follow it until it ends, running the worker ``module`` in each launch;
    returns this node's work folder. Raises UserError when the plans differ or node 0 never answers,
    NodeLost when it stops answering."""
    from torch.distributed import DistError


    node = Follower(cfg, digest, n_cells)
    work = Path(cfg.output.out) / node.run_id / "work" / f"node{cfg.nodes.node_rank}"
    work.mkdir(parents=True, exist_ok=True)
    become_subreaper()
    sampler, _ = start_samplers(cfg.profiling.sample_hz, gpu=cfg.matrix.device == "cuda")
    pushed = [time.monotonic()]

    def tick() -> None:
        """Ship telemetry every PUSH_S; a stop signal is raised here."""
        check_stop()
        if sampler is not None and time.monotonic() - pushed[0] > PUSH_S:
            pushed[0] = time.monotonic()
            node.push_samples(sampler.drain())

    seq, why = 0, "ended"
    try:
        while True:
            cmd = _next_command(node, seq, tick)
            if cmd["kind"] == "end":
                status = cmd.get("status", "")
                why = f"node 0 ended the run ({status})"
                if status != "complete":  # interrupted or stopped there: not a success here either
                    raise NodeLost(f"node 0 ended the run early ({status}); this node stops")
                break
            _run_launch(node, cfg, seq, cmd, work, tick, module)
            seq += 1
    except NodeLost as e:
        why = str(e)
        raise
    except DistError as e:  # any request to node 0's store: it went away with node 0's launcher
        said = " ".join(str(e).split())[:80]
        why = f"node 0 at {cfg.nodes.rdzv_endpoint} stopped answering ({said}); this node stops"
        raise NodeLost(why) from None
    except BaseException as e:
        why = f"stopped: {type(e).__name__}: {e}"
        raise
    finally:
        if sampler is not None:
            sampler.stop()
        node.bye(why)
    return work


def _next_command(node: Follower, seq: int, tick) -> dict:
    key = f"cmd/{seq}"
    while True:
        tick()
        node._check_node0()
        if node.store.check([key]):
            return json.loads(node.store.get(key))
        time.sleep(0.1)


def _run_launch(node: Follower, cfg, seq: int, cmd: dict, work: Path, tick, module: str) -> None:
    """This node's part of one launch, until it exits or node 0 stops it."""
    plan: spec.GroupPlan = spec.load(spec.GroupPlan, cmd["plan"])
    prefix = str(work / Path(plan.events_prefix).name)
    trace_dir = None
    if plan.trace_dir:
        trace_dir = str(work / "traces")
        Path(trace_dir).mkdir(exist_ok=True)
    plan = dataclasses.replace(plan, events_prefix=prefix, trace_dir=trace_dir)
    Path(prefix + ".json").write_text(spec.dump(plan))
    launch = Launch(prefix, cmd["nproc"], module=module, env=child_env(cmd["nproc"], cfg.nodes.node_rank, node.share),
                    nnodes=cfg.nodes.nnodes, endpoint=cfg.nodes.rdzv_endpoint, rdzv_id=cmd["rdzv_id"],
                    rdzv_timeout_s=cfg.nodes.rdzv_timeout_s, local_addr=node.me["local_addr"])
    killed: list[str] = []
    try:
        while True:
            exited = launch.exited()
            for line in launch.events.lines():
                if spec.load_event(line).__class__ is spec.Error:  # node 0's leader reports the rest
                    node.push_event(seq, line)
            if exited:
                break
            if node.stopped(seq):
                # Node 0's part ended: a part that ended well ends here within moments too.
                if not launch.wait(5.0):
                    killed = launch.kill()
                break
            node._check_node0()
            tick()
            time.sleep(0.05)
    except BaseException:
        launch.kill(grace_s=1.0)
        raise
    left = launch.survivors() + killed
    rc = launch.returncode
    reason = launch.crash_reason() if rc else ""
    node.done(seq, {"rc": rc, "reason": reason, "survivors": left})
