"""Hugging Face causal language models as workloads: ``hf:<model_type>[key=value,...]``.

The model is the causal-LM class of ``model_type`` (``AutoModelForCausalLM.from_config``) built
from its config class (``AutoConfig.for_model``) with SDPA attention and dropout off; no weights are
downloaded, nothing touches the network. Its values come from the seed (:func:`init_params`), its
data are synthetic next-token batches, as for the built-in GPT. transformers is optional, imported
only when an ``hf:`` workload is resolved (``pip install 'parbench[hf]'``).

The HF model is taken apart into the pieces its forward runs one after another (:class:`HFCausalLM`):
the embedding, one piece per decoder layer (the model's own layer class, called with the rotary
position embeddings, position ids and causal attention it needs, computed from the hidden states
alone: SDPA's ``is_causal``), and the final norm with the LM head. FSDP shards each decoder layer as
a unit, pipelines cut between layers, and the tensor-parallel plan is the model's own declared one
(``config.base_model_tp_plan`` and the class's ``_tp_plan``), applied with torch's
``parallelize_module``.

Model types: ``llama``, ``mistral``, ``qwen2``, ``qwen3`` and ``gpt2``, whose forward is the plain
embed / layers / norm / head loop this split reproduces; others are refused.

Defaults, overridable by any integer config key (``hf:llama[num_hidden_layers=8,hidden_size=1024]``;
a config's names or its ``attribute_map`` aliases: gpt2 takes ``hidden_size`` for ``n_embd``) and by
``seq_len`` and ``global_batch``:

* llama, mistral, qwen2, qwen3: hidden_size=512, num_hidden_layers=4, num_attention_heads=8,
  num_key_value_heads=4, intermediate_size=1536, vocab_size=8192, head_dim=hidden_size/heads (21M);
* gpt2: hidden_size=512, num_hidden_layers=4, num_attention_heads=8, vocab_size=8192, n_positions=1024
  (17M parameters, embedding and head tied);
* all: seq_len=256, global_batch=8; special-token ids outside the vocabulary cleared.
"""

from __future__ import annotations

import difflib
import math
import re
from collections import defaultdict
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from bench.core.errors import UserError
from bench.workloads.base import Workload, display_name, init_by_name, seeded
from bench.workloads.catalog import HF_INSTALL

PREFIX = "hf:"
INSTALL = HF_INSTALL

_DECODER = {"hidden_size": 512, "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 4,
            "intermediate_size": 1536, "vocab_size": 8192}
_GPT2 = {"hidden_size": 512, "num_hidden_layers": 4, "num_attention_heads": 8, "vocab_size": 8192}
_DATA = {"seq_len": 256, "global_batch": 8}
#: Keys that are sizes or counts: 0 would build an empty model that still reports ok.
_SIZES = {"hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "intermediate_size",
          "vocab_size", "head_dim", "seq_len", "global_batch"}


@dataclass(frozen=True)
class Family:
    """Where a model type keeps its pieces: attribute names on the causal-LM class (``base``, its
    decoder) and on the decoder; ``positions`` a learned table added to the token embedding,
    ``rotary`` the module whose cos/sin each layer's attention needs."""

    base: str
    tokens: str
    positions: str | None
    layers: str
    norm: str
    rotary: str | None
    defaults: dict[str, int]


_LLAMA = Family(base="model", tokens="embed_tokens", positions=None, layers="layers", norm="norm",
                rotary="rotary_emb", defaults=_DECODER)
FAMILIES: dict[str, Family] = {
    "llama": _LLAMA, "mistral": _LLAMA, "qwen2": _LLAMA, "qwen3": _LLAMA,
    "gpt2": Family(base="transformer", tokens="wte", positions="wpe", layers="h", norm="ln_f", rotary=None,
                   defaults=_GPT2),
}


def _transformers() -> SimpleNamespace:
    """The parts of transformers this module uses, imported on first use: ``import bench.workloads``
    must work (and stay fast) without it."""
    try:
        import transformers
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    except ImportError as e:
        if getattr(e, "name", None) in ("transformers", None):
            raise UserError(f"hf: workloads need transformers: {INSTALL}") from None
        raise UserError(f"hf: workloads cannot import transformers ({type(e).__name__}: {e}); {INSTALL}") from None
    return SimpleNamespace(AutoConfig=transformers.AutoConfig, AutoModelForCausalLM=transformers.AutoModelForCausalLM,
                           ROPE_INIT_FUNCTIONS=ROPE_INIT_FUNCTIONS, version=transformers.__version__)


class Embed(nn.Module):
    """Token embedding, plus the learned position table where the model has one (gpt2)."""

    def __init__(self, tokens: nn.Module, positions: nn.Module | None):
        super().__init__()
        self.tokens = tokens
        self.positions = positions

    def forward(self, idx: Tensor) -> Tensor:
        h = self.tokens(idx)
        if self.positions is not None:
            h = h + self.positions(torch.arange(idx.shape[1], device=idx.device))
        return h


class Layer(nn.Module):
    """One decoder layer of the model's own class, called as its model calls it, with what it needs
    computed from the hidden states alone: position ids 0..T-1, the rotary cos/sin of the model's
    rotary module (shared by every layer piece; it holds buffers only), and no mask: SDPA runs
    causal attention with ``is_causal``, what the HF model's mask amounts to without padding."""

    def __init__(self, layer: nn.Module, rotary: nn.Module | None):
        super().__init__()
        self.layer = layer
        self.rotary = rotary

    def forward(self, h: Tensor) -> Tensor:
        kw: dict[str, Any] = {}
        if self.rotary is not None:
            pos = torch.arange(h.shape[1], device=h.device).unsqueeze(0)
            kw = {"position_ids": pos, "position_embeddings": self.rotary(h, pos)}
        out = self.layer(h, attention_mask=None, **kw)
        return out[0] if isinstance(out, tuple) else out  # older transformers return (hidden_states,)


class Head(nn.Module):
    """The final norm and the LM head (tied to the token embedding where the config ties them)."""

    def __init__(self, norm: nn.Module, lm_head: nn.Module):
        super().__init__()
        self.norm = norm
        self.lm_head = lm_head

    def forward(self, h: Tensor) -> Tensor:
        return self.lm_head(self.norm(h))


class HFCausalLM(nn.Module):
    """An HF causal LM as embed, layers, head: the HF model's own modules, regrouped. ``hf_names``
    maps each module's name here to its name in the HF model, so that the HF tensor-parallel plan
    (written against the HF names) finds its modules; ``hf_tp_plan`` is that plan."""

    def __init__(self, hf_model: nn.Module, family: Family):
        super().__init__()
        base = getattr(hf_model, family.base)
        rotary = getattr(base, family.rotary) if family.rotary else None
        self.embed = Embed(getattr(base, family.tokens), getattr(base, family.positions) if family.positions else None)
        self.layers = nn.ModuleList(Layer(layer, rotary) for layer in getattr(base, family.layers))
        self.head = Head(getattr(base, family.norm), hf_model.lm_head)
        hf_of = {id(m): n for n, m in hf_model.named_modules()}
        self.hf_names = {n: hf_of[id(m)] for n, m in self.named_modules() if id(m) in hf_of}
        self.hf_class = type(hf_model).__name__
        # The declared plan: the decoder's (config.base_model_tp_plan, the layers) and the causal-LM
        # class's (its head). Without the decoder's there is nothing worth splitting (gpt2).
        layers = getattr(hf_model.config, "base_model_tp_plan", None) or {}
        head = dict(getattr(type(hf_model), "_tp_plan", None) or {}) if layers else {}
        self.hf_tp_plan = {**head, **{f"{family.base}.{k}": v for k, v in layers.items()}}

    def forward(self, idx: Tensor) -> Tensor:
        h = self.embed(idx)
        for layer in self.layers:
            h = layer(h)
        return self.head(h)


def blocks(model: nn.Module) -> list[nn.Module]:
    """Embed, one piece per decoder layer, head: applied in turn they are the model's forward."""
    return [model.embed, *model.layers, model.head]


def _ties(model: nn.Module) -> list[list[str]]:
    """Names of each parameter that the model holds under more than one name (tied weights)."""
    names: dict[int, list[str]] = defaultdict(list)
    for n, p in model.named_parameters(remove_duplicate=False):
        names[id(p)].append(n)
    return [ns for ns in names.values() if len(ns) > 1]


def _retie(model: nn.Module, ties: list[list[str]]) -> None:
    """Tie again what ``to_empty`` untied (it gives each module its own new tensor)."""
    for first, *rest in ties:
        p = model.get_parameter(first)
        for name in rest:
            owner, _, attr = name.rpartition(".")
            setattr(model.get_submodule(owner), attr, p)


def _rope(hf: SimpleNamespace, module: nn.Module) -> Tensor:
    """The inverse frequencies a rotary module computes at construction, as transformers' own
    ``_init_weights`` recomputes them after a meta-device build."""
    fn = getattr(module, "rope_init_fn", None)  # transformers 4.x keeps it on the module
    if fn is None:
        fn = (module.compute_default_rope_parameters if module.rope_type == "default"
              else hf.ROPE_INIT_FUNCTIONS[module.rope_type])
    return fn(module.config)[0]


def init_params(model: nn.Module, *, seed: int, n_layer: int, std: float) -> None:
    """Give every parameter and buffer of ``model`` off the meta device its value: matrices
    (embeddings included) normal with std ``std`` (the config's ``initializer_range``), residual
    projections (``o_proj``, ``down_proj``, gpt2's ``c_proj``) ``std / sqrt(2 n_layer)`` as GPT-2 has
    it; biases 0, other vectors (norm weights) 1; rotary ``inv_freq`` recomputed from the config.
    Each parameter draws from its own generator, seeded from ``seed`` and its name in the whole
    model, on its device: its value does not depend on how the model is cut or sharded, and a
    DTensor's local shard takes its part of the full value (:func:`bench.workloads.base.init_by_name`)."""
    residual = std / math.sqrt(2 * n_layer)
    init_by_name(model, seed,
                 std=lambda name: residual if name.endswith(("o_proj.weight", "down_proj.weight", "c_proj.weight"))
                 else std,
                 vector=lambda name: 0.0 if name.endswith(".bias") else 1.0)
    with torch.no_grad():
        _init_buffers(model)


def _init_buffers(model: nn.Module) -> None:
    """Rotary ``inv_freq`` (and ``original_inv_freq``) from the config; any other buffer has no
    rule, and a model that holds one is refused rather than trained with garbage."""
    hf = None
    for name, b in model.named_buffers():
        if b.device.type == "meta":
            continue
        owner_name, _, attr = name.rpartition(".")
        owner = model.get_submodule(owner_name)
        if attr in ("inv_freq", "original_inv_freq") and "RotaryEmbedding" in type(owner).__name__:
            hf = hf or _transformers()
            b.copy_(_rope(hf, owner).to(b.device, b.dtype))
        elif attr == "bias" and b.dtype == torch.bool:  # gpt2 before transformers 5: eager attention's mask
            b.copy_(torch.ones(b.shape, dtype=torch.bool, device=b.device).tril())
        elif attr == "masked_bias":  # and its fill value (SDPA uses neither)
            b.fill_(-1e4)
        else:
            raise ValueError(f"no initial value for buffer {name}: hf workloads set parameters and rotary "
                             "frequencies only")


@dataclass(frozen=True)
class Spec:
    """A resolved ``hf:`` workload: its config and data dimensions."""

    model_type: str
    family: Family
    config: Any
    seq_len: int
    global_batch: int

    @property
    def std(self) -> float:
        """The init std: the config's ``initializer_range``, 0.02 where it names none."""
        return float(getattr(self.config, "initializer_range", None) or 0.02)


def _check_keys(model_type: str, defaults: dict[str, Any], cls: type, dims: dict[str, int]) -> None:
    known = set(defaults) | set(getattr(cls, "attribute_map", {})) | set(_DATA)
    for key, value in dims.items():
        if key not in known:
            close = difflib.get_close_matches(key, sorted(known), n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise UserError(f"workload hf:{model_type}: {cls.__name__} has no key {key!r}{hint}; use a key of "
                            f"{cls.__name__}, or seq_len, global_batch")
        if re.search(r"dropout|pdrop", key):
            raise UserError(f"workload hf:{model_type}: {key} stays 0 (dropout would make strategies disagree)")
        if key in _SIZES and value < 1:
            raise UserError(f"workload hf:{model_type}: {key}={value} must be >= 1 (a size or a count); drop it for "
                            "the default")


def _config(hf: SimpleNamespace, model_type: str, dims: dict[str, int]) -> Spec:
    """The config of ``model_type`` with the family defaults and ``dims``, dropout off."""
    try:
        base = hf.AutoConfig.for_model(model_type)
    except ValueError:
        fix = "upgrade it: pip install -U transformers" if model_type in FAMILIES else \
            f"use one of {', '.join(sorted(FAMILIES))}"
        raise UserError(f"workload hf:{model_type}: transformers {hf.version} knows no model type {model_type!r}; "
                        f"{fix}") from None
    if model_type not in FAMILIES:
        raise UserError(f"workload hf:{model_type}: parbench cannot cut {type(base).__name__} into its layers; "
                        f"use one of {', '.join(sorted(FAMILIES))}")
    family, cls, defaults = FAMILIES[model_type], type(base), base.to_dict()
    _check_keys(model_type, defaults, cls, dims)
    alias = getattr(cls, "attribute_map", {})  # a key as the class stores it (gpt2: hidden_size -> n_embd)
    given = {alias.get(k, k): _typed(defaults.get(alias.get(k, k)), v) for k, v in dims.items() if k not in _DATA}
    values: dict[str, Any] = {alias.get(k, k): v for k, v in family.defaults.items()}
    values.update(given)
    values.update({k: 0.0 for k, v in defaults.items() if re.search(r"dropout|pdrop", k) and isinstance(v, float)})
    if "head_dim" in defaults and "head_dim" not in given:  # llama-like configs, which alias neither key
        values["head_dim"] = values["hidden_size"] // values["num_attention_heads"]
    values["use_cache"] = False
    for tok in ("bos_token_id", "eos_token_id", "pad_token_id"):
        if isinstance(defaults.get(tok), int) and defaults[tok] >= values["vocab_size"] and tok not in given:
            values[tok] = None  # random tokens need no special ids; HF warns of ids outside the vocabulary
    try:
        config = hf.AutoConfig.for_model(model_type, **values)
    except Exception as e:  # noqa: BLE001 - transformers validates the values its own way
        raise UserError(f"workload hf:{model_type}: {cls.__name__} refused the values: "
                        f"{' '.join(str(e).split())}"[:300]) from None
    data = {**_DATA, **{k: v for k, v in dims.items() if k in _DATA}}
    spec = Spec(model_type=model_type, family=family, config=config, seq_len=data["seq_len"],
                global_batch=data["global_batch"])
    _check_shapes(spec, given)
    return spec


def _typed(default: Any, value: int) -> Any:
    """An integer from the spec as the config's field type: transformers 5 configs are strict."""
    return bool(value) if isinstance(default, bool) else float(value) if isinstance(default, float) else value


def _check_shapes(spec: Spec, given: dict[str, Any]) -> None:
    """Shapes the model cannot take, as one line naming the fix."""
    cfg, where = spec.config, f"workload hf:{spec.model_type}"
    heads, kv = cfg.num_attention_heads, getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    if "head_dim" not in given and cfg.hidden_size % heads:
        raise UserError(f"{where}: hidden_size={cfg.hidden_size} does not divide by num_attention_heads={heads}")
    if heads % kv:
        raise UserError(f"{where}: num_attention_heads={heads} does not divide by num_key_value_heads={kv}")
    longest = getattr(cfg, "max_position_embeddings", None)
    if longest is not None and spec.seq_len > longest:
        raise UserError(f"{where}: seq_len={spec.seq_len} exceeds max_position_embeddings={longest}; raise "
                        "max_position_embeddings or lower seq_len")
    window = getattr(cfg, "sliding_window", None)
    sliding = getattr(cfg, "use_sliding_window", True) and "sliding_attention" in (
        getattr(cfg, "layer_types", None) or ["sliding_attention"])
    if window is not None and sliding and spec.seq_len > window:
        raise UserError(f"{where}: seq_len={spec.seq_len} exceeds sliding_window={window}; the layer pieces run "
                        "full causal attention, so keep seq_len <= sliding_window")


def build(hf: SimpleNamespace, spec: Spec, seed: int, device: torch.device) -> HFCausalLM:
    """The model on ``device`` with its values (on the meta device: shapes only), built on the meta
    device and placed with ``to_empty`` as the built-in GPT is: HF's own random init never runs."""
    with torch.device("meta"):
        model = HFCausalLM(hf.AutoModelForCausalLM.from_config(spec.config, attn_implementation="sdpa"), spec.family)
    if device.type != "meta":
        ties = _ties(model)
        model.to_empty(device=device)
        _retie(model, ties)
        init_params(model, seed=seed, n_layer=spec.config.num_hidden_layers, std=spec.std)
    return model


def _matmul_params(model: nn.Module) -> int:
    """Weights in matrix products: every Linear (the LM head too, tied or not) and gpt2's Conv1D."""
    return sum(m.weight.numel() for m in model.modules()
               if isinstance(m, nn.Linear) or type(m).__name__ == "Conv1D")


def flops_per_sample(model: nn.Module, spec: Spec) -> float:
    """Training FLOPs per sequence: 6 x matmul weights per token, plus attention's QK^T and AV (2
    matmuls of 2 x T x heads x head_dim flops a token forward, x3 with backward). Causal masking is
    not discounted (the PaLM MFU convention); embedding lookups count none."""
    cfg, t = spec.config, spec.seq_len
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    per_token = 6 * _matmul_params(model) + 12 * cfg.num_hidden_layers * cfg.num_attention_heads * head_dim * t
    return float(per_token * t)


# torch.distributed.tensor is imported where used, as in gpt.py: it would add 2 s to `import bench.workloads`.


def _torch_style(style: str):
    """torch's ParallelStyle for an HF plan entry (transformers' own meaning of each name), or None
    for ``replicated_with_grad_allreduce`` (handled by :func:`_allreduce_grads`)."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    gathered, split = {"output_layouts": Replicate()}, {"input_layouts": Replicate()}
    styles = {  # colwise: output sharded on features (each rank runs its heads); rowwise: output all-reduced
        "colwise": (ColwiseParallel, {}), "rowwise": (RowwiseParallel, {}),
        "colwise_gather_output": (ColwiseParallel, gathered), "colwise_rep": (ColwiseParallel, gathered),
        "rowwise_split_input": (RowwiseParallel, split), "rowwise_rep": (RowwiseParallel, split),
        "replicated_with_grad_allreduce": None,
    }
    if style not in styles:
        raise ValueError(f"the model's tensor-parallel plan uses style {style!r}, which parbench does not map to "
                         f"torch's parallel styles (it maps {', '.join(sorted(styles))})")
    return None if styles[style] is None else styles[style][0](**styles[style][1])


def _allreduce_grads(module: nn.Module, mesh) -> None:
    """A module kept whole on every rank but fed only this rank's heads (qwen3's q_norm, k_norm):
    each rank's gradient is its heads' part, summed over the mesh once accumulated. As transformers
    does, the hook goes on the parameters the forward finds: a sharding applied later (FSDP2 under
    fsdp-tp) replaces the parameter objects."""
    group = mesh.get_group()
    hooked: dict[str, nn.Parameter] = {}

    def reduce(p: Tensor) -> None:
        dist.all_reduce(p.grad, group=group)

    def before_forward(mod: nn.Module, _args) -> None:
        if torch.is_grad_enabled():
            for name, p in mod.named_parameters(recurse=False):
                if p.requires_grad and hooked.get(name) is not p:
                    p.register_post_accumulate_grad_hook(reduce)
                    hooked[name] = p

    module.register_forward_pre_hook(before_forward)


def _plan_targets(model: HFCausalLM) -> list[tuple[str, str]]:
    """(module name in ``model``, style) for each entry of the model's declared plan; entries on
    a tied parameter are left out (splitting the head would untie it from the embedding)."""
    tied = {n for names in _ties(model) for n in names}
    out = []
    for key, style in model.hf_tp_plan.items():
        pattern = re.escape(key).replace(r"\*", r"\d+")
        found = [mine for mine, theirs in model.hf_names.items() if re.fullmatch(pattern, theirs)]
        if not found:
            raise ValueError(f"tensor-parallel plan entry {key!r} matches no module of the model")
        for mine in found:
            if not any(f"{mine}.{p}" in tied for p, _ in model.get_submodule(mine).named_parameters()):
                out.append((mine, style))
    return out


def tensor_parallel(model: nn.Module, mesh, *, plan: str = "megatron", **options: Any) -> None:
    """Tensor-parallelize ``model`` in place with the model's own declared plan: q/k/v and the MLP's
    gate and up projections column-wise (each rank runs its share of the query and key/value heads:
    the HF attention reshapes to ``-1`` heads), the attention output and MLP down projection
    row-wise, the untied LM head column-wise with its logits gathered: the Megatron split
    (``tp_plan=megatron``). Sequence parallel (``sp``) is not what the model declares: refused, as
    are other options. Returns no loss context: the logits are whole on every rank."""
    from torch.distributed.tensor.parallel import parallelize_module

    if options:
        raise ValueError(f"hf workloads take no tensor-parallel option {sorted(options)[0]!r}")
    if plan != "megatron":
        raise ValueError(f"tensor-parallel plan {plan!r}: hf workloads run the model's own declared plan "
                         "(column/row-wise linears); use tp_plan=megatron")
    targets = _plan_targets(model)
    styles = {style: _torch_style(style) for _, style in targets}  # refuse an unknown style before splitting
    for name, style in targets:
        module = model.get_submodule(name)
        if styles[style] is None:
            _allreduce_grads(module, mesh)
        else:
            parallelize_module(module, mesh, styles[style])


def make(model_type: str, *, seed: int = 0, **dims: int) -> Workload:
    """The ``hf:<model_type>`` workload with ``dims`` overriding config keys (and ``seq_len``,
    ``global_batch``). A UserError names a missing transformers, an unknown model type or key."""
    hf = _transformers()
    spec = _config(hf, model_type, dims)
    cfg = spec.config
    meta = build(hf, spec, seed, torch.device("meta"))
    params = sum(p.numel() for p in meta.parameters())
    kv = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads

    def batch(step: int):
        tokens = torch.randint(0, cfg.vocab_size, (spec.global_batch, spec.seq_len + 1), generator=seeded(seed, step))
        return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()

    def loss(logits: Tensor, target: Tensor) -> Tensor:
        # transformers' ForCausalLMLoss on already shifted labels: mean cross entropy in fp32
        return F.cross_entropy(logits.float().flatten(0, 1), target.flatten(), ignore_index=-100)

    return Workload(
        name=display_name(PREFIX + model_type, dims),
        build=lambda device: build(hf, spec, seed, device),
        init=lambda model: init_params(model, seed=seed, n_layer=cfg.num_hidden_layers, std=spec.std),
        batch=batch,
        loss=loss,
        blocks=blocks,
        global_batch=spec.global_batch,
        flops_per_sample=flops_per_sample(meta, spec),
        n_blocks=cfg.num_hidden_layers + 2,
        # The key/value heads are the fewer: they must divide by the tensor-parallel degree (the
        # query heads, a multiple of them, then do too).
        n_heads=kv,
        params=params,
        tp_plan=tensor_parallel if meta.hf_tp_plan else None,
        description=f"{meta.hf_class} (transformers {hf.version}, no weights) "
                    f"d={cfg.hidden_size} L={cfg.num_hidden_layers} H={cfg.num_attention_heads} kv={kv} "
                    f"T={spec.seq_len} V={cfg.vocab_size}, {params / 1e6:.1f}M params",
    )
