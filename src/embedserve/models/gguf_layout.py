"""How one GGUF architecture maps onto what the engine reads from a Hugging Face directory.

llama.cpp's converter renames every tensor (`blk.N.attn_q.weight`, `token_embd.weight`, ...)
and keeps the config as `{arch}.*` metadata. A `GGUFLayout` undoes both for one architecture:
its names back to Hugging Face's, its metadata back to the `config.json` a Hugging Face export
would have (read through the same registry as a directory), and the few value changes the
converter makes (Gemma's norms stored as 1 + w, llama's interleaved Q/K rows).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from embedserve.errors import ModelLoadError

# Reads `{arch}.{key}`; a missing key without a default is a ModelLoadError naming it.
Meta = Callable[..., Any]
# (metadata reader, the file's tensors by name (shape in ggml order)) -> config.json
ConfigFn = Callable[[Meta, dict[str, Any]], dict[str, Any]]

_BLOCK = re.compile(r"^blk\.(\d+)\.(\w+)\.(weight|bias)$")


@dataclass(frozen=True)
class GGUFLayout:
    config: ConfigFn
    top: dict[str, str]  # GGUF stem -> Hugging Face name (`token_embd` -> `embed_tokens`)
    layer: dict[str, str]  # GGUF block part -> Hugging Face module inside layer N
    layer_prefix: str  # Hugging Face's layer N, `{}` standing for N
    norm_shift: float = 0.0  # the converter stores each `*norm.weight` plus this
    skipped: frozenset[str] = field(default_factory=frozenset)  # GGUF tensors read elsewhere

    def hf_name(self, name: str) -> str:
        """A GGUF tensor name as Hugging Face spells it (unknown names pass through unchanged,
        for the model's loader to refuse by name)."""
        if m := _BLOCK.match(name):
            layer, part, kind = m.groups()
            if part in self.layer:
                return f"{self.layer_prefix.format(layer)}{self.layer[part]}.{kind}"
            return name
        stem, _, kind = name.rpartition(".")
        return f"{self.top[stem]}.{kind}" if stem in self.top else name

    def restore(self, name: str, tensor: np.ndarray) -> np.ndarray:
        """The tensor's values as the Hugging Face checkpoint holds them."""
        if self.norm_shift and name.endswith("norm.weight"):
            return tensor - self.norm_shift
        return tensor


def unpermute_rope_rows(w: np.ndarray, num_heads: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row order. Per head, GGUF interleaves the two rotary halves:

    Hugging Face rows:  a0 a1 ... a_{h-1} | b0 b1 ... b_{h-1}     (h = head_dim / 2)
    GGUF rows:          a0 b0 a1 b1 ... a_{h-1} b_{h-1}
    """
    rows = w.shape[0]
    return w.reshape(num_heads, rows // num_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def vocab_size(tensors: dict[str, Any]) -> int:
    embed = tensors.get("token_embd.weight")
    if embed is None:
        raise ModelLoadError("the GGUF file has no token_embd.weight tensor")
    return int(embed.shape[1])  # ggml order: [hidden, vocab]


def _decoder_config(architecture: str, model_type: str) -> ConfigFn:
    def config(get: Meta, tensors: dict[str, Any]) -> dict[str, Any]:
        hidden, heads = int(get("embedding_length")), int(get("attention.head_count"))
        head_dim = int(get("attention.key_length", hidden // heads))
        rope_dims = int(get("rope.dimension_count", head_dim))
        if rope_dims != head_dim:
            raise ModelLoadError(f"partial RoPE ({rope_dims} of {head_dim} head dimensions) is not supported")
        scaling = get("rope.scaling.type", "none")
        raw: dict[str, Any] = {
            "architectures": [architecture],
            "model_type": model_type,
            "vocab_size": vocab_size(tensors),
            "hidden_size": hidden,
            "num_hidden_layers": int(get("block_count")),
            "num_attention_heads": heads,
            "num_key_value_heads": int(get("attention.head_count_kv", heads)),
            "head_dim": head_dim,
            "intermediate_size": int(get("feed_forward_length")),
            "max_position_embeddings": int(get("context_length")),
            "rms_norm_eps": float(get("attention.layer_norm_rms_epsilon")),
            "rope_theta": float(get("rope.freq_base", 10000.0)),
            "rope_scaling": None if scaling == "none" else {"rope_type": scaling},
        }
        if window := get("attention.sliding_window", 0):
            raw.update(sliding_window=int(window), use_sliding_window=True)
        return raw

    return config


DECODER_LAYER = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_DECODER_TOP = {"token_embd": "embed_tokens", "output_norm": "norm", "output": "lm_head"}

DECODERS: dict[str, GGUFLayout] = {
    arch: GGUFLayout(_decoder_config(hf, arch), _DECODER_TOP, DECODER_LAYER, "layers.{}.")
    for arch, hf in (
        ("llama", "LlamaForCausalLM"),
        ("qwen2", "Qwen2ForCausalLM"),
        ("qwen3", "Qwen3ForCausalLM"),
    )
}
