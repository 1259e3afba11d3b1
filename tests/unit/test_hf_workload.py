"""``hf:<model_type>`` workloads (bench/workloads/hf.py): the pieces run the HF model's own forward,
the values come from the seed whatever device or sharding, the tensor-parallel plan is the model's
declared one, and bad specs are one-line errors. Tiny configs: the whole module takes seconds."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from bench.core.errors import UserError
from bench.workloads import hf, planned, resolve
from strategies.common import stage_modules
from strategies.fsdp import unit_blocks
from strategies.tensor import tp_check

transformers = pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[2]
DECODER = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
               intermediate_size=64, vocab_size=128, seq_len=8, global_batch=4)
TINY = {"llama": DECODER, "qwen2": DECODER, "qwen3": DECODER, "mistral": DECODER,
        "gpt2": dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, vocab_size=128, seq_len=8,
                     global_batch=4)}
LAYER_CLASS = {"llama": "LlamaDecoderLayer", "qwen2": "Qwen2DecoderLayer", "qwen3": "Qwen3DecoderLayer",
               "mistral": "MistralDecoderLayer", "gpt2": "GPT2Block"}


def hf_and_pieces(model_type: str, seed: int = 0):
    """The HF causal-LM model and the workload's model made of the same modules, with the values
    the workload gives them: the HF forward and the pieces compute with the very same tensors."""
    lib = hf._transformers()
    spec = hf._config(lib, model_type, TINY[model_type])
    with torch.device("meta"):
        theirs = lib.AutoModelForCausalLM.from_config(spec.config, attn_implementation="sdpa")
    ours = hf.HFCausalLM(theirs, spec.family)
    ties = hf._ties(theirs)
    theirs.to_empty(device="cpu")
    hf._retie(theirs, ties)
    hf.init_params(ours, seed=seed, n_layer=spec.config.num_hidden_layers, std=0.02)
    return theirs, ours


@pytest.mark.parametrize("model_type", sorted(TINY))
def test_the_pieces_in_turn_are_the_hf_forward(model_type):
    theirs, ours = hf_and_pieces(model_type)
    wl = resolve(f"hf:{model_type}", **TINY[model_type])
    x, y = wl.batch(0)
    with torch.no_grad():
        ref = theirs(input_ids=x, labels=x, shift_labels=y, use_cache=False)
        h = x
        for piece in wl.blocks(ours):
            h = piece(h)
    assert h.shape == (4, 8, 128)
    torch.testing.assert_close(h, ref.logits, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(wl.loss(h, y), ref.loss, rtol=1e-5, atol=1e-6)  # the model's own loss
    assert len(wl.blocks(ours)) == wl.n_blocks == 4


@pytest.mark.parametrize("model_type", sorted(TINY))
def test_each_fsdp_unit_is_one_decoder_layer_of_the_models_own_class(model_type):
    wl = resolve(f"hf:{model_type}", **TINY[model_type])
    units = unit_blocks(wl, wl.build(torch.device("meta")))
    assert len(units) == 2
    for unit in units:
        assert [type(m).__name__ for m in unit.modules() if type(m).__name__ == LAYER_CLASS[model_type]] == [
            LAYER_CLASS[model_type]]


def test_pipelines_cut_between_layers_and_refuse_to_untie_gpt2():
    wl = resolve("hf:llama", **DECODER)
    stages = stage_modules(wl, wl.build(torch.device("meta")), 2, [0.0, 1.0, 1.0, 0.0])
    assert [len(s) for s in stages] == [2, 2]
    gpt2 = resolve("hf:gpt2", **TINY["gpt2"])
    with pytest.raises(ValueError, match="tied weights"):
        stage_modules(gpt2, gpt2.build(torch.device("cpu")), 2, [0.0, 1.0, 1.0, 0.0])


def test_build_and_batches_are_deterministic_from_the_seed():
    wl, other = resolve("hf:llama", seed=1, **DECODER), resolve("hf:llama", seed=2, **DECODER)
    a, b = wl.build(torch.device("cpu")).state_dict(), wl.build(torch.device("cpu")).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    c = other.build(torch.device("cpu")).state_dict()
    assert not torch.equal(a["layers.0.layer.self_attn.q_proj.weight"], c["layers.0.layer.self_attn.q_proj.weight"])
    assert torch.equal(wl.batch(3)[0], wl.batch(3)[0]) and not torch.equal(wl.batch(3)[0], wl.batch(4)[0])
    x, y = wl.batch(0)
    assert x.shape == y.shape == (4, 8) and x.device.type == "cpu" and torch.equal(x[:, 1:], y[:, :-1])


@pytest.mark.parametrize("model_type", ["llama", "qwen3"])
def test_init_after_a_meta_build_reproduces_build(model_type):
    wl = resolve(f"hf:{model_type}", **TINY[model_type])
    model = wl.build(torch.device("meta"))
    model.to_empty(device="cpu")  # garbage values, rotary frequencies included
    wl.init(model)
    ref = wl.build(torch.device("cpu"))
    got, want = dict(model.named_parameters()), dict(ref.named_parameters())
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in got)
    bufs, ref_bufs = dict(model.named_buffers()), dict(ref.named_buffers())
    assert "layers.0.rotary.inv_freq" in bufs and all(torch.equal(bufs[k], ref_bufs[k]) for k in bufs)


def test_a_tied_model_stays_tied_when_built():
    model = resolve("hf:gpt2", **TINY["gpt2"]).build(torch.device("cpu"))
    assert model.head.lm_head.weight is model.embed.tokens.weight


def test_names_facts_and_the_tensor_parallel_checks():
    wl, facts = planned("hf:llama", {"hidden_size": 32, "num_hidden_layers": 3}, seed=0, global_batch=None,
                        timeout_s=60)
    assert wl.name == "hf:llama(hidden_size=32,num_hidden_layers=3)" and facts.n_blocks == 5
    assert facts.has_tp_plan and facts.n_heads == 4 and facts.params == wl.params
    t = 256  # the default seq_len; 3 layers of 8 heads of 4 dimensions
    assert wl.flops_per_sample == (6 * hf._matmul_params(wl.build(torch.device("meta"))) + 12 * 3 * 8 * 4 * t) * t
    assert "kv=4" in wl.description and "LlamaForCausalLM" in wl.description
    assert tp_check(facts, 2) is None and "do not divide" in tp_check(facts, 3)
    _, gpt2 = planned("hf:gpt2", TINY["gpt2"], seed=0, global_batch=16, timeout_s=60)
    assert gpt2.global_batch == 16 and not gpt2.has_tp_plan and "no tensor-parallel plan" in tp_check(gpt2, 2)


def test_config_keys_take_the_configs_names_and_aliases():
    wl = resolve("hf:gpt2", n_embd=48, num_hidden_layers=1, num_attention_heads=4, vocab_size=64, seq_len=8)
    assert "d=48 L=1" in wl.description
    tied = resolve("hf:qwen2", tie_word_embeddings=1, **DECODER).build(torch.device("cpu"))
    assert tied.head.lm_head.weight is tied.embed.tokens.weight


@pytest.mark.parametrize("spec, dims, message", [
    ("hf:llama", {"hiden_size": 64}, r"LlamaConfig has no key 'hiden_size' \(did you mean hidden_size\?\)"),
    ("hf:nosuchmodel", {}, "knows no model type 'nosuchmodel'; use one of gpt2, llama"),
    ("hf:bert", {}, "cannot cut BertConfig into its layers"),
    ("hf:llama", {"num_hidden_layers": 0}, "num_hidden_layers=0 must be >= 1"),
    ("hf:llama", {"attention_dropout": 1}, "attention_dropout stays 0"),
    ("hf:llama", {"num_key_value_heads": 3}, "num_attention_heads=8 does not divide by num_key_value_heads=3"),
    ("hf:gpt2", {"seq_len": 2048}, "seq_len=2048 exceeds max_position_embeddings=1024"),
    ("hf:llama", {"hidden_size": 100}, r"hidden[_ ]size\W*100"),  # ours, or transformers' own check
])
def test_bad_specs_are_one_line_errors(spec, dims, message):
    with pytest.raises(UserError, match=message) as e:
        resolve(spec, **dims)
    assert "\n" not in str(e.value)


def test_without_transformers_the_error_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # `import transformers` now raises ImportError
    with pytest.raises(UserError, match=r"pip install 'parbench\[hf\]'"):
        resolve("hf:llama")


def test_importing_the_workloads_does_not_import_transformers():
    """Only a function of hf.py imports it: no module of bench/workloads does at import time."""
    for path in (ROOT / "bench" / "workloads").glob("*.py"):
        top = ast.parse(path.read_text()).body
        names = [a.name for n in top if isinstance(n, ast.Import) for a in n.names]
        names += [n.module or "" for n in top if isinstance(n, ast.ImportFrom)]
        assert not [n for n in names if n.split(".")[0] == "transformers"], path


@pytest.fixture
def two_rank_mesh():
    """A 2-rank mesh in this process on torch's fake backend: the shards are rank 0's and the
    collectives do nothing, enough to see what the plan splits and that the shapes run."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    try:
        yield init_device_mesh("cpu", (2,))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("model_type", ["llama", "qwen3"])
def test_the_declared_plan_splits_heads_and_mlp_and_runs_with_local_heads(two_rank_mesh, model_type, monkeypatch):
    from torch.distributed.tensor import DTensor, Shard

    reduced = []  # qwen3's per-head q_norm and k_norm: whole on each rank, their gradients summed
    monkeypatch.setattr(dist, "all_reduce", lambda t, group=None: reduced.append(tuple(t.shape)))
    wl = resolve(f"hf:{model_type}", **DECODER)
    model = wl.build(torch.device("meta"))
    assert wl.tp_plan(model, two_rank_mesh, plan="megatron") is None  # no loss context: logits are whole
    model.to_empty(device="cpu")
    wl.init(model)
    split = {n: (tuple(p.to_local().shape), p.placements[0]) for n, p in model.named_parameters()
             if isinstance(p, DTensor)}
    attn = "layers.1.layer.self_attn."
    assert split[attn + "q_proj.weight"] == ((16, 32), Shard(0))  # 2 of 4 query heads of 8
    assert split[attn + "k_proj.weight"] == ((8, 32), Shard(0))  # 1 of 2 key/value heads
    assert split[attn + "o_proj.weight"] == ((32, 16), Shard(1))
    assert split["layers.0.layer.mlp.down_proj.weight"] == ((32, 32), Shard(1))
    assert split["head.lm_head.weight"] == ((64, 32), Shard(0))  # colwise, logits gathered
    assert "embed.tokens.weight" not in split
    x, y = wl.batch(0)
    out = model(x)
    assert out.shape == (4, 8, 128) and not isinstance(out, DTensor)
    wl.loss(out, y).backward()
    assert reduced == ([(8,)] * 4 if model_type == "qwen3" else [])  # 2 layers x (q_norm, k_norm) of head_dim 8


def test_the_plan_refuses_what_it_cannot_honour(two_rank_mesh, monkeypatch):
    wl = resolve("hf:llama", **DECODER)
    model = wl.build(torch.device("meta"))
    with pytest.raises(ValueError, match="use tp_plan=megatron"):
        wl.tp_plan(model, two_rank_mesh, plan="sp")
    with pytest.raises(ValueError, match="no tensor-parallel option 'async_tp'"):
        wl.tp_plan(model, two_rank_mesh, async_tp=True)
    monkeypatch.setitem(model.hf_tp_plan, "model.layers.*.mlp.up_proj", "packed_colwise")
    with pytest.raises(ValueError, match="style 'packed_colwise'"):
        wl.tp_plan(model, two_rank_mesh)
    tied = resolve("hf:qwen2", tie_word_embeddings=1, **DECODER)
    model = tied.build(torch.device("cpu"))
    tied.tp_plan(model, two_rank_mesh)
    assert model.head.lm_head.weight is model.embed.tokens.weight  # the head stays whole: still tied
