"""A serving process: one replica, one nn.DataParallel front, or one pipeline stage.

Messages arrive on the process's own queue (and, under the shared policy, on the shared queue):

* ``("probe", [(rid, size), ...])``: answer fixed inputs (the parity check), reply ``("probe", wid, outs)``;
* ``("begin", cfg)``: serve one cell until its ``("end",)`` sentinel; cfg has ``source`` (own or
  shared), ``batch_max``, ``batch_wait_s`` and ``slow_s`` (seconds added to each batch: a
  deliberately slow replica for the balancing checks);
* ``("req", rid, tenant, size)``: a request; answers go back as ``("done", wid, records)``;
* ``("quit",)``.

Stages pass ``("act", metas, x, inputs)`` down the chain. Generating, a request's micro-batch goes
round the chain once per token: ``("gen", metas, x, key, start, toks)`` down it (``key`` names the
micro-batch's KV caches, one share per stage; ``start`` the position of ``x``'s first token;
``toks`` the tokens generated so far), and from the last stage ``("tok", ...)`` back to stage 0
with the next token, until the last token; each stage frees its cache on that final pass.

Times are ``time.perf_counter()``, which on Linux is CLOCK_MONOTONIC: one clock for every process
on the host, so the launcher's arrival stamps and the workers' start/end stamps subtract.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import threading
import time
import traceback
from collections import deque
from dataclasses import dataclass
from typing import Any

import torch

from bench.measure.nvml import EnergyMeter
from bench.serve.models import (
    Graphed,
    ServeModel,
    kv_run,
    next_token,
    padded_length,
    resolve_precision,
    run_grouped,
    run_padded,
)
from bench.serve.wire import pack, unpack
from bench.workloads import resolve

#: Generating micro-batches a pipeline's stage 0 lets into the stages at once. Past it, new requests
#: wait at stage 0 (as queue time) while the ones in flight finish: each in flight holds a KV cache
#: on every stage, so an overloaded cell would otherwise grow GPU memory with its backlog.
MAX_INFLIGHT = 64


@dataclass
class WorkerSpec:
    """What one process builds; plain data, so it pickles to a spawned process."""

    wid: int
    role: str  # replica | dp | stage
    devices: list[str]  # torch device strings; dp: all of them, else one
    workload: str
    dims: dict[str, int]
    seed: int
    task: str
    gen_tokens: int
    precision: str
    stage: int = 0
    n_stages: int = 1
    graphs: bool = False  # a replica replays its forward from CUDA graphs (bench.serve.models.Graphed)


#: Exit status of a serving process whose launcher is gone.
ORPHANED_EXIT = 70


def main(spec: WorkerSpec, own_q: Any, shared_q: Any, next_q: Any, result_q: Any) -> None:
    """Process entry point: build, report ready, then serve until told to quit."""
    _exit_with_launcher()
    try:
        w = _Worker(spec, own_q, shared_q, next_q, result_q)
    except BaseException as e:  # noqa: BLE001 - the launcher marks the cells failed with its one line
        result_q.put(("error", spec.wid, traceback.format_exc(), _one_line(e)))
        return
    result_q.put(("ready", spec.wid, {"pid": os.getpid()}))
    try:
        w.loop()
    except BaseException as e:  # noqa: BLE001
        result_q.put(("error", spec.wid, traceback.format_exc(), _one_line(e)))


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:200]}" if text else type(e).__name__


def _exit_with_launcher() -> None:
    """Exit this process when the launcher is gone (killed, even by SIGKILL, which it cannot pass
    on): a serving process blocks on its queue and would otherwise wait for ever, holding its device."""
    parent = mp.parent_process()
    if parent is None:  # not started by multiprocessing (a test calling main directly)
        return

    def watch() -> None:
        parent.join()  # returns when the launcher's end of the sentinel pipe closes
        os._exit(ORPHANED_EXIT)

    threading.Thread(target=watch, name="parbench-serve-watch", daemon=True).start()


class _Worker:
    def __init__(self, spec: WorkerSpec, own_q: Any, shared_q: Any, next_q: Any, result_q: Any):
        self.spec, self.own_q, self.shared_q, self.next_q, self.result_q = spec, own_q, shared_q, next_q, result_q
        self.device = torch.device(spec.devices[0])
        if self.device.type == "cpu":
            torch.set_num_threads(1)  # processes as devices: one core's worth each
        else:
            torch.cuda.set_device(self.device)
        self.dtype = resolve_precision(spec.precision, self.device)
        self.deferred: deque[tuple] = deque()  # a generating pipeline's stage 0: requests waiting for room
        wl = resolve(spec.workload, seed=spec.seed, **spec.dims)
        self.sm = ServeModel.create(wl, task=spec.task, gen_tokens=spec.gen_tokens, seed=spec.seed)
        # a stage builds the model on the host and moves only its own part to its device
        model = self.sm.build(torch.device("cpu") if spec.role == "stage" else self.device, self.dtype)
        if spec.role == "stage":
            self.part = self.sm.parts(model, spec.n_stages)[spec.stage].to(self.device)
            del model
            self.last = spec.stage == spec.n_stages - 1
            # generation: the last stage hands each new token back to stage 0 (next_q is stage 0's queue)
            self.gen = self.sm.task == "generate"
            self.pieces = list(self.part)
            self.caches: dict[tuple[int, int], list] = {}  # micro-batch key -> this stage's KV caches
            self.keys = 0
            self.probe_out: dict[int, torch.Tensor] = {}
            self.inflight = self.inflight_max = 0  # stage 0: micro-batches begun and not at their last pass
        else:
            self.fn = self.sm.runner(model)
            if spec.graphs:  # set where it applies (ServeConfig.graphs_for): CUDA replicas that score or classify
                self.fn = Graphed(self.fn, self.device)
            if spec.role == "dp" and self.device.type == "cuda":
                ids = [torch.device(d).index for d in spec.devices]
                self.fn = torch.nn.DataParallel(self.fn, device_ids=ids, output_device=ids[0])
        self.energy = EnergyMeter([torch.device(d).index for d in spec.devices]) \
            if self.device.type == "cuda" else None

    # --- computing ---------------------------------------------------------------------------
    @torch.no_grad()
    def _answer(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        return run_grouped(self.fn, inputs, self.device, self.dtype, pad=self._pads, pad_limit=self.sm.max_size)

    @property
    def _pads(self) -> bool:
        return self.sm.task == "score" and self.sm.is_gpt

    @torch.no_grad()
    def _stage(self, x: torch.Tensor, inputs: torch.Tensor) -> torch.Tensor:
        x = x.to(self.device)
        if x.is_floating_point():
            x = x.to(self.dtype)
        y = self.part(x)
        if self.last:
            y = self.sm.finish(y, inputs)
        return y.float().cpu() if self.last else y.cpu()  # activations cross processes on the host

    # --- the loop ----------------------------------------------------------------------------
    def loop(self) -> None:
        while True:
            msg = self.own_q.get()
            kind = msg[0]
            if kind == "quit":
                return
            if kind == "probe":
                self._probe(msg)
            elif kind == "probe_act":
                self._probe(msg)
            elif kind in ("gen", "tok"):  # a generating probe going round the stages
                self._gen_pass(msg)
            elif kind == "begin":
                self._cell(msg[1])

    def _probe(self, msg: tuple) -> None:
        """Serve fixed requests through the serving path. ``("probe", items)`` returns the answers
        (parity; equal shapes go together, as a dynamic batch would). ``("probe", items, "warm", k)``
        is the warm-up before a pool's first cell: each request alone and as k equal ones, nothing
        but completion returns; it pays each shape's first-call costs (kernel selection, allocator
        growth) outside the measured cells."""
        quiet = len(msg) > 2 and msg[2] == "warm"
        k = int(msg[3]) if quiet and len(msg) > 3 else 1  # also as a batch of k equal requests
        if self.spec.role != "stage":
            inputs = [self.sm.make_input(r, s) for r, s in msg[1]]
            if quiet:  # one at a time, as most requests are served, then k together (a dynamic
                for x in inputs:  # batch; nn.DataParallel needs rows for every device)
                    self._answer([x])
                    if k > 1:
                        self._answer([x] * k)
                if k > 1 and self._pads:  # every shape a padded batch of 2..k prompts can take
                    self._warm_padded(inputs, k)
                self.result_q.put(("probe", self.spec.wid, []))
            else:  # together: equal shapes form a dynamic batch (parity of the batched path too)
                self.result_q.put(("probe", self.spec.wid, self._answer(inputs)))
            return
        if msg[0] == "probe":  # stage 0: the requests' inputs, one at a time
            items = [(self.sm.make_input(r, s), self.sm.make_input(r, s)) for r, s in msg[1]]
            if k > 1:  # and k of one size as one micro-batch, as stage 0 concatenates equal shapes
                items += [(torch.cat([x] * k), torch.cat([x] * k)) for x, _ in items]
            if self.gen:  # each item a micro-batch going round the stages; the last stage collects
                if not items:  # nothing goes round, so the last stage would never answer
                    self.result_q.put(("probe", self.spec.wid, []))
                    return
                for i, (x, _) in enumerate(items):
                    self._gen_begin([("probe", i, len(items), quiet)], x)
                return
        else:
            items = [(unpack(x), unpack(inp)) for x, inp in msg[1]]
        outs = [(self._stage(x, inp), inp) for x, inp in items]
        if self.last:
            self.result_q.put(("probe", self.spec.wid, [] if quiet else [y for y, _ in outs]))
        else:
            outs = [(pack(y), pack(inp)) for y, inp in outs]
            self.next_q.put(("probe_act", outs, "warm") if quiet else ("probe_act", outs))

    def _warm_padded(self, inputs: list[torch.Tensor], k: int) -> None:
        """Run each (rows, padded length) a dynamic batch of these prompts can make: 2..k rows at
        each length :func:`bench.serve.models.padded_length` gives their sizes."""
        longest = {padded_length(int(x.shape[1]), self.sm.max_size): x for x in inputs}
        for _, x in sorted(longest.items()):
            for rows in range(2, k + 1):
                run_padded(self.fn, [x] * rows, self.device, self.sm.max_size)

    def _cell(self, cfg: dict[str, Any]) -> None:
        src = self.shared_q if cfg.get("source") == "shared" and self.shared_q is not None else self.own_q
        bmax, wait, slow = int(cfg.get("batch_max", 1)), float(cfg.get("batch_wait_s", 0.0)), \
            float(cfg.get("slow_s", {}).get(self.spec.wid, 0.0))
        if self.device.type == "cuda":
            for d in self.spec.devices:
                torch.cuda.reset_peak_memory_stats(torch.device(d))
        e0 = self.energy.read() if self.energy else None
        if self.spec.role == "stage" and self.gen:
            self.caches.clear()  # nothing of an earlier cell is in flight once it ended
        busy, batches, served = 0.0, 0, 0
        ending = False
        while not ending:
            first = src.get()
            if first[0] == "end":
                break
            if first[0] == "req" and self._full():  # generating at the limit: it waits its turn
                self.deferred.append(first)
                continue
            batch = [first]
            if first[0] == "req" and bmax > 1:  # dynamic batching: more until full or the wait is over
                deadline = time.perf_counter() + wait
                while len(batch) < bmax:
                    left = deadline - time.perf_counter()
                    try:
                        m = src.get(timeout=left) if left > 0 else src.get_nowait()
                    except queue.Empty:
                        break
                    if m[0] == "end":
                        ending = True
                        break
                    batch.append(m)
            t, n = self._run_batch(batch, slow)
            busy += t
            batches += 1
            served += n
            while self.deferred and not self._full():  # room again: the longest-waiting request first
                t, n = self._run_batch([self.deferred.popleft()], slow)
                busy += t
                batches += 1
                served += n
        e1 = self.energy.read() if self.energy else None
        stats = {"busy_s": busy, "batches": batches, "served": served, "peak_mem_bytes": self._peak_mem(),
                 "energy_j": (e1 - e0) if e0 is not None and e1 is not None else None}
        if self.spec.role == "stage" and self.gen and self.spec.stage == 0:
            stats["inflight_max"], self.inflight_max = self.inflight_max, 0
        self.result_q.put(("ended", self.spec.wid, stats))
        if self.spec.role == "stage" and not self.last:
            self.next_q.put(("end",))

    def _run_batch(self, batch: list[tuple], slow: float) -> tuple[float, int]:
        """Serve one batch; returns its busy seconds and the requests in it."""
        if batch[0][0] in ("gen", "tok"):  # generating: one pass of a micro-batch round the stages
            t0 = time.perf_counter()
            first = self._gen_pass(batch[0])
            return time.perf_counter() - t0, len(batch[0][1]) if first else 0
        if batch[0][0] == "act":  # a later pipeline stage: one micro-batch from upstream
            _, metas, x, inputs = batch[0]
            t0 = time.perf_counter()
            x, inputs = unpack(x), unpack(inputs)
            y = self._stage(x, inputs)
            t1 = time.perf_counter()
            self._emit(metas, y, inputs, t0, t1)
            return t1 - t0, len(metas)
        inputs = [self.sm.make_input(m[1], m[3]) for m in batch]
        start = time.perf_counter()
        if self.spec.role == "stage":  # stage 0: concatenate equal shapes as one micro-batch each
            groups: dict[tuple, list[int]] = {}
            for i, x in enumerate(inputs):
                groups.setdefault(tuple(x.shape[1:]), []).append(i)
            for idx in groups.values():
                inp = torch.cat([inputs[i] for i in idx])
                metas = [(batch[i][1], start, len(batch)) for i in idx]
                if self.gen:
                    self._gen_begin(metas, inp)
                    continue
                y = self._stage(inp, inp)
                self._emit(metas, y, inp, start, time.perf_counter())
        else:
            self._answer(inputs)
        if slow > 0:
            time.sleep(slow)
        end = time.perf_counter()
        if self.spec.role != "stage":
            self.result_q.put(("done", self.spec.wid, [(m[1], start, end, len(batch)) for m in batch]))
        return end - start, len(batch)

    def _emit(self, metas: list[tuple], y: torch.Tensor, inputs: torch.Tensor, t0: float, t1: float) -> None:
        """Pass a micro-batch down the pipeline, or report it from the last stage."""
        if self.last:
            self.result_q.put(("done", self.spec.wid, [(rid, start, t1, nb) for rid, start, nb in metas]))
        else:
            self.next_q.put(("act", metas, pack(y), pack(inputs)))  # activations cross on the host, as bytes

    # --- generation across stages ----------------------------------------------------------
    def _full(self) -> bool:
        """Stage 0 of a generating pipeline with MAX_INFLIGHT micro-batches in flight."""
        return self.spec.role == "stage" and self.gen and self.spec.stage == 0 and self.inflight >= MAX_INFLIGHT

    def _gen_begin(self, metas: list[tuple], idx: torch.Tensor) -> None:
        """Stage 0: a new micro-batch of prompts ``idx``: its prefill pass under a new cache key."""
        self.keys += 1
        self.inflight += 1
        self.inflight_max = max(self.inflight_max, self.inflight)
        self._gen_pass(("gen", metas, idx, (self.spec.wid, self.keys), 0, []))

    @torch.no_grad()
    def _gen_pass(self, msg: tuple) -> bool:
        """One pass of a generating micro-batch through this stage's pieces; returns whether it was
        the prefill (the pass that counts the requests as served by this stage)."""
        _, metas, x, key, start, toks = msg  # x and toks[i] as wire.pack made them (x: a tensor at stage 0)
        final = len(toks) + 1 == self.sm.gen_tokens  # this pass makes the last token
        if final and self.spec.stage == 0:
            self.inflight -= 1  # its last pass through stage 0: room for a waiting request
        x = unpack(x).to(self.device)
        if x.is_floating_point():
            x = x.to(self.dtype)
        y, cache = kv_run(self.pieces, x, start, self.caches.pop(key, None))
        if not final:
            self.caches[key] = cache
        nxt_start = start + x.shape[1]
        if not self.last:
            self.next_q.put(("gen", metas, pack(y), key, start, toks))  # activations cross on the host
            return start == 0
        toks = [*toks, pack(next_token(y))]
        if not final:  # round again: stage 0 feeds the new token at the next position
            self.next_q.put(("tok", metas, toks[-1], key, nxt_start, toks))
            return start == 0
        answer = torch.cat([unpack(t) for t in toks], dim=1).float()
        t1 = time.perf_counter()
        if metas and metas[0][0] == "probe":
            _, i, total, quiet = metas[0]
            self.probe_out[i] = answer
            if len(self.probe_out) == total:
                outs = [self.probe_out[k] for k in range(total)]
                self.probe_out = {}
                self.result_q.put(("probe", self.spec.wid, [] if quiet else outs))
        else:
            self.result_q.put(("done", self.spec.wid, [(rid, t0, t1, nb) for rid, t0, nb in metas]))
        return start == 0

    def _peak_mem(self) -> float | None:
        if self.device.type == "cuda":
            return float(max(torch.cuda.max_memory_allocated(torch.device(d)) for d in self.spec.devices))
        try:
            import psutil

            return float(psutil.Process().memory_info().rss)
        except Exception:  # noqa: BLE001 - no figure rather than a wrong one
            return None
