"""Load a decoder straight from a GGUF file (llama.cpp's format), weights dequantized.

The file holds everything: `{arch}.*` numbers become the ModelConfig (through the same
`config.json` path as a Hugging Face directory), `tokenizer.ggml.*` the tokenizer, and each
tensor is dequantized (`gguf.quants`) and renamed to its Hugging Face name:

    token_embd / output_norm / blk.N.attn_{q,k,v,output,q_norm,k_norm} / blk.N.ffn_{gate,up,down}
    -> embed_tokens / norm / layers.N.self_attn.{q,k,v,o}_proj ... / layers.N.mlp.{gate,up,down}_proj

llama.cpp's converter reorders the rows of Q and K for `llama` files (its RoPE pairs
neighbouring dimensions, Hugging Face pairs the two halves of a head); we undo that here.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tokenizers import Tokenizer as HFTokenizer

from embedserve.errors import ModelLoadError
from embedserve.models.gguf_tokenizer import gguf_tokenizer
from embedserve.models.registry import model_config_from_hf, sliding_window
from embedserve.models.source import ModelSource, default_pooling, override_pooling

# GGUF `general.architecture` -> Hugging Face architecture class.
ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}

_TOP_LEVEL = {"token_embd": "embed_tokens", "output_norm": "norm", "output": "lm_head"}
_LAYER = {
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
_BLOCK = re.compile(r"^blk\.(\d+)\.(\w+)\.(weight|bias)$")


def hf_name(name: str) -> str:
    """A GGUF tensor name as Hugging Face spells it (unknown names pass through unchanged)."""
    if m := _BLOCK.match(name):
        layer, part, kind = m.groups()
        return f"layers.{layer}.{_LAYER[part]}.{kind}" if part in _LAYER else name
    stem, _, kind = name.rpartition(".")
    return f"{_TOP_LEVEL[stem]}.{kind}" if stem in _TOP_LEVEL else name


def unpermute_rope_rows(w: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Undo llama.cpp's Q/K row order. Per head, GGUF interleaves the two rotary halves:

    Hugging Face rows:  a0 a1 ... a_{h-1} | b0 b1 ... b_{h-1}     (h = head_dim / 2)
    GGUF rows:          a0 b0 a1 b1 ... a_{h-1} b_{h-1}
    """
    rows = w.shape[0]
    return w.reshape(num_heads, rows // num_heads // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


@dataclass(frozen=True, kw_only=True)
class GGUFModel(ModelSource):
    reader: Any  # gguf.GGUFReader (memory-mapped; tensors are read on demand)
    arch: str

    def _meta(self, key: str, default: Any = None) -> Any:
        return _field(self.reader, key, default)

    def tokenizer(self) -> HFTokenizer:
        return gguf_tokenizer(self._meta)

    def weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        from gguf import quants

        cfg = self.model
        for t in self.reader.tensors:
            if t.name == "rope_freqs.weight":
                raise ModelLoadError("per-dimension RoPE frequency factors (rope_freqs) are not supported")
            try:
                values = np.array(quants.dequantize(t.data, t.tensor_type), dtype=np.float32)
            except Exception as e:  # unknown quantization types raise NotImplementedError and others
                raise ModelLoadError(f"cannot dequantize {t.name} ({t.tensor_type.name}): {e}") from e
            tensor = torch.from_numpy(values)
            if self.arch == "llama" and t.name.endswith((".attn_q.weight", ".attn_k.weight")):
                heads = cfg.num_attention_heads if ".attn_q." in t.name else cfg.num_key_value_heads
                tensor = unpermute_rope_rows(tensor, heads)
            yield hf_name(t.name), tensor


def _field(reader: Any, key: str, default: Any = None) -> Any:
    field = reader.fields.get(key)
    return default if field is None else field.contents()


def read_gguf(path: str | Path, pooling: str | None = None, normalize: bool | None = None) -> GGUFModel:
    from gguf import GGUFReader

    file = Path(path)
    if not file.is_file():
        raise ModelLoadError(f"GGUF file {file} does not exist")
    try:
        reader = GGUFReader(file, "r")
    except Exception as e:  # bad magic, truncated header or tensor data: gguf raises assorted types
        raise ModelLoadError(f"cannot read GGUF file {file}: {type(e).__name__}: {e}") from e
    arch = _field(reader, "general.architecture")
    if arch not in ARCHITECTURES:
        raise ModelLoadError(
            f"unsupported GGUF architecture {arch!r}; supported: {', '.join(sorted(ARCHITECTURES))}"
        )
    raw = _hf_config(reader, arch)
    model = model_config_from_hf(raw)
    return GGUFModel(
        path=file,
        model=model,
        pooling=override_pooling(default_pooling(model), pooling, normalize),
        sliding_window=sliding_window(raw),
        reader=reader,
        arch=arch,
    )


def _hf_config(reader: Any, arch: str) -> dict[str, Any]:
    """The `config.json` a Hugging Face export of this file would have."""

    def get(key: str, default: Any = None) -> Any:
        value = _field(reader, f"{arch}.{key}", default)
        if value is None:
            raise ModelLoadError(f"the GGUF file has no {arch}.{key}")
        return value

    embed = next((t for t in reader.tensors if t.name == "token_embd.weight"), None)
    if embed is None:
        raise ModelLoadError("the GGUF file has no token_embd.weight tensor")
    hidden, heads = int(get("embedding_length")), int(get("attention.head_count"))
    head_dim = int(get("attention.key_length", hidden // heads))
    rope_dims = int(get("rope.dimension_count", head_dim))
    if rope_dims != head_dim:
        raise ModelLoadError(f"partial RoPE ({rope_dims} of {head_dim} head dimensions) is not supported")
    scaling = _field(reader, f"{arch}.rope.scaling.type", "none")
    raw: dict[str, Any] = {
        "architectures": [ARCHITECTURES[arch]],
        "model_type": arch,
        "vocab_size": int(embed.shape[1]),  # ggml order: [hidden, vocab]
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
    window = _field(reader, f"{arch}.attention.sliding_window")
    if window:
        raw.update(sliding_window=int(window), use_sliding_window=True)
    return raw
