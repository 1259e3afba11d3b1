"""Inference models: the KV cache generates what full recomputation does; batching changes no answer."""

from __future__ import annotations

import pytest
import torch

from bench.serve.models import ServeModel, generate_naive, run_grouped
from bench.workloads import resolve

CPU = torch.device("cpu")


def test_kv_cache_generation_equals_recomputation():
    sm = ServeModel.create(resolve("gpt-tiny", seed=1), task="generate", gen_tokens=6, seed=1)
    model = sm.build(CPU, torch.float32)
    x = torch.cat([sm.make_input(i, 12) for i in range(4)])
    assert torch.equal(sm.runner(model)(x), generate_naive(model, x, 6))


def test_batched_answers_equal_one_at_a_time():
    for name, task, sizes in (("gpt-tiny", "score", [5, 9, 5, 9]), ("convnet", "classify", [1, 3, 2])):
        sm = ServeModel.create(resolve(name), task=task, gen_tokens=1, seed=0)
        fn = sm.runner(sm.build(CPU, torch.float32))
        inputs = [sm.make_input(i, s) for i, s in enumerate(sizes)]
        together = run_grouped(fn, inputs, CPU, torch.float32)
        alone = [run_grouped(fn, [x], CPU, torch.float32)[0] for x in inputs]
        for a, b in zip(together, alone):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
        assert [a.shape[0] for a in together] == [1 if task == "score" else s for s in sizes]


def test_pipeline_parts_compose_to_the_model():
    sm = ServeModel.create(resolve("gpt-tiny"), task="score", gen_tokens=1, seed=0)
    model = sm.build(CPU, torch.float32)
    x = sm.make_input(0, 16)
    y = x
    for part in sm.parts(model, 2):
        y = part(y)
    torch.testing.assert_close(sm.finish(y, x), sm.runner(model)(x))


def test_task_must_fit_the_workload_and_sizes_are_clipped():
    with pytest.raises(ValueError):
        ServeModel.create(resolve("convnet"), task="generate", gen_tokens=4, seed=0)
    sm = ServeModel.create(resolve("gpt-tiny"), task="generate", gen_tokens=8, seed=0)
    assert sm.max_size == 32 - 8 and sm.make_input(0, 1000).shape == (1, 24)
    assert sm.tokens(10) == 18 and sm.samples(10) == 1


def test_user_workload_through_the_import_seam():
    sm = ServeModel.create(resolve("tests.foreign_models:encoder_stack"), task="auto", gen_tokens=1, seed=0)
    assert sm.task == "classify" and not sm.is_gpt
    fn = sm.runner(sm.build(CPU, torch.float32))
    out = run_grouped(fn, [sm.make_input(1, 2), sm.make_input(2, 3)], CPU, torch.float32)
    assert [o.shape[0] for o in out] == [2, 3]


def test_generation_stage_by_stage_equals_the_whole_model():
    """What the pipeline placement's stages do for generation (each its pieces and its share of the
    cache, the last stage's token fed back to stage 0) gives the one-device tokens."""
    from bench.serve.models import kv_run, next_token

    sm = ServeModel.create(resolve("gpt-tiny", seed=2), task="generate", gen_tokens=5, seed=2)
    model = sm.build(CPU, torch.float32)
    x = torch.cat([sm.make_input(i, 10) for i in range(3)])
    want = sm.runner(model)(x)
    for n in (2, 3):
        stages = [list(p) for p in sm.parts(model, n)]
        caches: list = [None] * n
        toks, inp, start = [], x, 0
        while len(toks) < 5:
            y = inp
            for s, pieces in enumerate(stages):
                y, caches[s] = kv_run(pieces, y, start, caches[s])
            start += inp.shape[1]
            inp = next_token(y)
            toks.append(inp)
        assert torch.equal(torch.cat(toks, dim=1), want), n


def test_tensors_cross_between_stages_as_exact_bytes():
    import torch

    from bench.serve.wire import pack, unpack

    for t in (torch.randn(2, 5, 8).to(torch.bfloat16), torch.randn(3, 4), torch.arange(12).reshape(3, 4),
              torch.tensor(7), torch.empty(0, 4), torch.randn(4, 6)[:, ::2]):  # the last not contiguous
        w = pack(t)
        assert isinstance(w, tuple) and len(w) == 3 and isinstance(w[0], bytes) and isinstance(w[2], torch.dtype)
        back = unpack(w)
        assert back.dtype == t.dtype and back.shape == t.shape and torch.equal(back, t)
    x = torch.ones(2)
    assert unpack(x) is x  # a tensor passes through


def test_padded_lengths_are_few_so_that_they_can_be_warmed_up():
    from bench.serve.models import padded_length

    assert [padded_length(n) for n in (1, 16, 17, 31, 32, 96, 97)] == [16, 16, 32, 32, 32, 96, 112]
    assert padded_length(97, limit=100) == 100 and padded_length(120, limit=100) == 120  # never cut
    assert len({padded_length(n, 128) for n in range(16, 97)}) == 6  # the prompts of the GPU runs


def test_prompts_of_several_lengths_score_as_one_padded_call_with_the_same_answers():
    wl = resolve("gpt-tiny")
    sm = ServeModel.create(wl, task="score", gen_tokens=0, seed=0)
    fn = sm.runner(sm.build(torch.device("cpu"), torch.float32))
    inputs = [sm.make_input(r, s) for r, s in ((1, 5), (2, 17), (3, 1), (4, 9), (5, 17))]
    calls = []

    def counted(*args):
        calls.append(args[0].shape)
        return fn(*args)

    alone = [fn(x) for x in inputs]
    padded = run_grouped(counted, inputs, torch.device("cpu"), torch.float32, pad=True)
    assert calls == [torch.Size([5, 32])]  # one call, right-padded past the longest to a multiple of 16
    for a, b in zip(padded, alone):
        assert a.shape == b.shape == (1,)
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-6), (a, b)
    calls.clear()  # never past the model's context (gpt-tiny: 32 tokens; a limit of 20 here)
    again = run_grouped(counted, inputs, torch.device("cpu"), torch.float32, pad=True, pad_limit=20)
    assert calls == [torch.Size([5, 20])]
    assert all(torch.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in zip(again, alone))
    calls.clear()  # without pad (or for equal lengths only) the old grouping stands
    run_grouped(counted, inputs, torch.device("cpu"), torch.float32)
    assert sorted(s[1] for s in calls) == [1, 5, 9, 17]


def test_the_warm_up_runs_every_shape_a_dynamic_batch_of_the_sizes_can_take():
    """Any batch of 2..k of the warmed prompts, padded, has a (rows, length) the warm-up ran."""
    import itertools
    from types import SimpleNamespace

    from bench.serve.models import padded_length
    from bench.serve.worker import _Worker

    wl = resolve("gpt-tiny")
    sm = ServeModel.create(wl, task="score", gen_tokens=0, seed=0)
    shapes = set()

    def fn(xs, lengths=None):
        shapes.add(tuple(xs.shape))
        return torch.zeros(xs.shape[0])

    sizes = [1, 3, 15, 16, 17, 30, 32]
    inputs = [sm.make_input(i, n) for i, n in enumerate(sizes)]
    fake = SimpleNamespace(fn=fn, device=torch.device("cpu"), sm=sm)
    _Worker._warm_padded(fake, inputs, 4)
    made = {(len(b), padded_length(max(b), sm.max_size)) for r in range(2, 5)
            for b in itertools.combinations_with_replacement(sizes, r)}
    assert made <= shapes and len(shapes) == 2 * 3  # lengths 16 and 32, rows 2..4
