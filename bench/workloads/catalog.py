"""The built-in workloads as ``parbench list`` shows them, readable without torch.

Each entry is what its factory's ``Workload.description`` says at the default dimensions (a test
builds every one and compares), so listing the workloads builds none of them.
"""

from __future__ import annotations

#: name -> description at the default dimensions, in the registry's order
BUILTIN: dict[str, str] = {
    "mlp": "MLP 256->512x4->16, 0.93M params",
    "convnet": "conv net widths [32, 64, 128] on 32x32, 0.11M params",
    "gpt-tiny": "decoder transformer d=64 L=2 H=4 T=32 V=256, 0.1M params",
    "gpt-small": "decoder transformer d=256 L=4 H=8 T=128 V=4096, 5.3M params",
    "gpt-50m": "decoder transformer d=512 L=12 H=8 T=512 V=16384, 54.8M params",
    "gpt-200m": "decoder transformer d=1024 L=16 H=16 T=1024 V=16384, 236.0M params",
    "gpt-20b": "decoder transformer d=6144 L=44 H=48 T=1024 V=32768, 20340.8M params",
}
#: the Hugging Face model types ``hf:<model_type>`` builds (bench.workloads.hf.FAMILIES)
HF_FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "gpt2")
#: how to install what ``hf:`` workloads need
HF_INSTALL = "pip install 'parbench[hf]' (or pip install transformers)"
