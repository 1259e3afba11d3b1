import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from bench.core.errors import UserError
from bench.core.knobs import Training
from bench.workloads import Workload, resolve, shard
from bench.workloads.gpt import SIZES


@pytest.mark.parametrize("name", ["mlp", "convnet", "gpt-tiny"])
def test_batches_depend_on_seed_and_step_only(name):
    a, b = resolve(name, seed=3), resolve(name, seed=3)
    assert all(torch.equal(x, y) for x, y in zip(a.batch(5), b.batch(5)))
    assert not torch.equal(a.batch(5)[0], a.batch(6)[0])
    assert not torch.equal(a.batch(5)[0], resolve(name, seed=4).batch(5)[0])


@pytest.mark.parametrize("name", ["mlp", "convnet", "gpt-tiny"])
def test_model_is_deterministic_and_param_count_is_right(name):
    wl = resolve(name)
    m1, m2 = wl.build(torch.device("cpu")), wl.build(torch.device("cpu"))
    assert all(torch.equal(p, q) for p, q in zip(m1.parameters(), m2.parameters()))
    assert sum(p.numel() for p in m1.parameters()) == wl.params


def test_flops_match_a_counter_up_to_the_known_differences():
    # FlopCounterMode skips the first layer's input gradient (inputs need none) and, on CPU, SDPA;
    # the analytic figures count both, as the 6N convention does.
    wl = resolve("mlp")
    m = wl.build(torch.device("cpu"))
    x, y = wl.batch(0)
    with FlopCounterMode(display=False) as fc:
        wl.loss(m(x), y).backward()
    first_layer_input_grad = 2 * 256 * 512
    assert fc.get_total_flops() / wl.global_batch == pytest.approx(wl.flops_per_sample - first_layer_input_grad)
    g = resolve("gpt-tiny")
    cfg = SIZES["gpt-tiny"]
    m = g.build(torch.device("cpu"))
    x, y = g.batch(0)
    with FlopCounterMode(display=False) as fc:
        g.loss(m(x), y).backward()
    attention = 12 * cfg.n_layer * cfg.d_model * cfg.seq_len * cfg.seq_len
    assert fc.get_total_flops() / g.global_batch == pytest.approx(g.flops_per_sample - attention)


def test_gpt_200m_has_at_least_200m_parameters():
    wl = resolve("gpt-200m")
    m = wl.build(torch.device("meta"))
    assert sum(p.numel() for p in m.parameters()) == wl.params >= 200_000_000


def test_gpt_20b_does_not_fit_one_device_and_scales_to_the_machine():
    from bench.workloads.gpt import layers_beyond

    wl = resolve("gpt-20b")
    m = wl.build(torch.device("meta"))  # shapes only: 81 GB of fp32 values are never allocated
    assert sum(p.numel() for p in m.parameters()) == wl.params > 20e9
    assert 8 * wl.params > 141 * 2**30  # values and gradients exceed an H200
    for gib in (24, 80, 141):
        n = layers_beyond(gib * 2**30)
        fits, beyond = resolve("gpt-20b", n_layer=n - 1).params, resolve("gpt-20b", n_layer=n).params
        assert 8 * fits < 1.15 * gib * 2**30 <= 8 * beyond


def test_gpt_init_gives_a_part_what_the_whole_model_has():
    """The same parameter drawn alone (as a shard or a stage would be) equals the whole model's."""
    from bench.workloads.gpt import init_params

    wl = resolve("gpt-tiny", n_layer=3)
    whole = dict(wl.build(torch.device("cpu")).named_parameters())
    meta = wl.build(torch.device("meta"))
    stage = meta[2]  # the second block alone on the device, the rest left on the meta device
    stage.to_empty(device="cpu")
    init_params(meta, 0, 3)
    for name, p in meta.named_parameters():
        if name.startswith("2."):
            assert torch.equal(p, whole[name]), name
        else:
            assert p.device.type == "meta"
    assert not torch.equal(whole["1.attn.qkv.weight"], whole["2.attn.qkv.weight"])  # each its own draw


def test_dimensions_are_settable_and_checked():
    wl = resolve("gpt-tiny", d_model=128, n_layer=3)
    assert wl.n_blocks == 5 and "d=128" in wl.description
    with pytest.raises(UserError, match="unknown GPT dimension"):
        resolve("gpt-tiny", depth=3)


def test_shard_splits_the_global_batch_evenly():
    wl = resolve("mlp", global_batch=8)
    x, y = wl.batch(0)
    parts = [shard((x, y), r, 4) for r in range(4)]
    assert torch.equal(torch.cat([p[0] for p in parts]), x)
    with pytest.raises(ValueError, match="does not divide"):
        shard((x, y), 0, 3)


def good_factory(seed: int = 0) -> Workload:
    return resolve("mlp", seed=seed)


def bad_factory():
    return 42


def test_user_workloads_load_or_fail_in_one_line():
    assert resolve("tests.unit.test_workloads:good_factory").name == "mlp"
    with pytest.raises(UserError, match="returned int"):
        resolve("tests.unit.test_workloads:bad_factory")
    with pytest.raises(UserError, match="cannot import 'no_such_pkg.mod'"):
        resolve("no_such_pkg.mod:f")
    with pytest.raises(UserError, match="unknown workload"):
        resolve("resnet")


def test_a_tied_model_is_not_built_on_the_meta_device_for_sharding():
    """to_empty gives each module its own tensor: a tied embedding and head would come apart."""
    import dataclasses

    from strategies.base import Context
    from strategies.common import build_for_sharding

    wl = resolve("gpt-tiny")

    def tied(device):
        m = wl.build(device)
        m[-1].out.weight = m[0].tok.weight
        return m

    ctx = Context(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), devices=(torch.device("cpu"),),
                  backend="gloo", seed=0, precision="fp32", training=Training(optimizer="sgd", lr=0.1))
    assert next(build_for_sharding(wl, ctx).parameters()).device.type == "meta"
    m = build_for_sharding(dataclasses.replace(wl, build=tied), ctx)
    assert next(m.parameters()).device.type == "cpu" and m[-1].out.weight is m[0].tok.weight


def test_the_bytes_training_holds_come_from_the_model_as_it_is_built():
    """fp32 parameters with gradients hold 8 bytes each; bf16 ones 4; a frozen one only its value.
    Counted on the meta device: gpt-20b's 163 GB are never allocated."""
    import dataclasses

    wl = resolve("gpt-tiny")
    assert wl.facts("gpt-tiny", {}).train_bytes == 8 * wl.params
    half = dataclasses.replace(wl, build=lambda d: wl.build(d).to(torch.bfloat16))
    assert half.facts("x", {}).train_bytes == 4 * wl.params

    def frozen_embedding(d):
        m = wl.build(d)
        m[0].tok.weight.requires_grad_(False)
        return m

    tok = SIZES["gpt-tiny"].vocab * SIZES["gpt-tiny"].d_model
    assert dataclasses.replace(wl, build=frozen_embedding).facts("x", {}).train_bytes == 8 * wl.params - 4 * tok
    assert resolve("gpt-20b").facts("gpt-20b", {}).train_bytes == 8 * resolve("gpt-20b").params
