"""The encoder GGUFs llama.cpp writes: `bert` (BERT / MiniLM / BGE / E5), `nomic-bert`
(nomic-embed-text v1 / v1.5) and `gemma-embedding` (EmbeddingGemma).

What the metadata does not carry follows llama.cpp's own loader, so a file means here what it
means there:
- gemma-embedding: every 6th layer is global and the rest slide (±window / 2, both ways); the
  sliding layers' RoPE base is 10,000; scores are scaled by 1/sqrt(head_dim) (llama.cpp has no
  `query_pre_attn_scalar`); norms are stored as 1 + w. The sentence-transformers Dense modules
  travel as `dense_2.weight` / `dense_3.weight` (no bias, identity), read by pooling/dense.py.
- nomic-bert: the converter already cut the context to the trained 2,048 tokens.
- bert: position rows start at 0 (a RoBERTa's padding offset is cut by the converter).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from embedserve.config import DenseLayer
from embedserve.errors import ModelLoadError
from embedserve.models.gguf_layout import DECODER_LAYER, GGUFLayout, Meta, vocab_size

GEMMA_DENSE = ("dense_2", "dense_3")


def _type_rows(tensors: dict[str, Any]) -> int:
    types = tensors.get("token_types.weight")
    return 0 if types is None else int(types.shape[1])


def _shared(get: Meta, tensors: dict[str, Any], architecture: str, model_type: str) -> dict[str, Any]:
    if get("attention.causal", False):
        raise ModelLoadError(
            f"this {architecture} GGUF asks for causal attention; an encoder attends both ways"
        )
    return {
        "architectures": [architecture],
        "model_type": model_type,
        "vocab_size": vocab_size(tensors),
        "hidden_size": int(get("embedding_length")),
        "num_hidden_layers": int(get("block_count")),
        "num_attention_heads": int(get("attention.head_count")),
        "intermediate_size": int(get("feed_forward_length")),
    }


def _bert_config(get: Meta, tensors: dict[str, Any]) -> dict[str, Any]:
    return {
        **_shared(get, tensors, "BertModel", "bert"),
        "max_position_embeddings": int(get("context_length")),
        "layer_norm_eps": float(get("attention.layer_norm_epsilon")),
        "type_vocab_size": _type_rows(tensors),
        "hidden_act": "gelu",
    }


def _nomic_config(get: Meta, tensors: dict[str, Any]) -> dict[str, Any]:
    return {
        **_shared(get, tensors, "NomicBertModel", "nomic_bert"),
        "max_trained_positions": int(get("context_length")),
        "layer_norm_eps": float(get("attention.layer_norm_epsilon")),
        "rope_theta": float(get("rope.freq_base", 10000.0)),  # llama.cpp's default too
        "type_vocab_size": _type_rows(tensors),
    }


def _gemma_config(get: Meta, tensors: dict[str, Any]) -> dict[str, Any]:
    shared = _shared(get, tensors, "Gemma3TextModel", "gemma3_text")
    heads = shared["num_attention_heads"]
    head_dim = int(get("attention.key_length", shared["hidden_size"] // heads))
    if int(get("attention.value_length", head_dim)) != head_dim:
        raise ModelLoadError("gemma-embedding GGUF: value_length differs from key_length")
    return {
        **shared,
        "num_key_value_heads": int(get("attention.head_count_kv", heads)),
        "head_dim": head_dim,
        "query_pre_attn_scalar": head_dim,
        "max_position_embeddings": int(get("context_length")),
        "rms_norm_eps": float(get("attention.layer_norm_rms_epsilon")),
        "rope_theta": float(get("rope.freq_base", 1_000_000.0)),
        "rope_local_base_freq": 10000.0,
        "sliding_window": int(get("attention.sliding_window")),
        "sliding_window_pattern": 6,
        "use_bidirectional_attention": True,
        "hidden_activation": "gelu_pytorch_tanh",
    }


def gemma_dense(path: Path, get: Meta, tensors: dict[str, Any], hidden: int) -> tuple[DenseLayer, ...]:
    """EmbeddingGemma's Dense modules, where the file has them (`--sentence-transformers-dense-modules`)."""
    layers: list[DenseLayer] = []
    width = hidden
    for name in GEMMA_DENSE:
        t = tensors.get(f"{name}.weight")
        if t is None:
            continue
        n_in, n_out = int(t.shape[0]), int(t.shape[1])  # ggml order: [in, out]
        declared = (int(get(f"{name}_feat_in", n_in)), int(get(f"{name}_feat_out", n_out)))
        if n_in != width or declared != (n_in, n_out):
            raise ModelLoadError(
                f"gemma-embedding GGUF: {name}.weight is [{n_out}, {n_in}] (metadata says in {declared[0]}, "
                f"out {declared[1]}) after a {width}-wide vector"
            )
        layers.append(DenseLayer(str(path), n_in, n_out, False, "identity", tensor=f"{name}.weight"))
        width = n_out
    return tuple(layers)


_BERT_LAYER = {
    "attn_q": "attention.self.query",
    "attn_k": "attention.self.key",
    "attn_v": "attention.self.value",
    "attn_output": "attention.output.dense",
    "attn_output_norm": "attention.output.LayerNorm",
    "ffn_up": "intermediate.dense",
    "ffn_down": "output.dense",
    "layer_output_norm": "output.LayerNorm",
}
_NOMIC_LAYER = {
    "attn_qkv": "attn.Wqkv",
    "attn_output": "attn.out_proj",
    "attn_output_norm": "norm1",
    "ffn_up": "mlp.fc11",
    "ffn_gate": "mlp.fc12",
    "ffn_down": "mlp.fc2",
    "layer_output_norm": "norm2",
}
_GEMMA_LAYER = {  # the decoders' names, with Gemma's four norms around attention and MLP
    **DECODER_LAYER,
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
_EMBEDDINGS = {
    "token_embd": "embeddings.word_embeddings",
    "token_types": "embeddings.token_type_embeddings",
}

ENCODERS: dict[str, GGUFLayout] = {
    "bert": GGUFLayout(
        _bert_config,
        {
            **_EMBEDDINGS,
            "position_embd": "embeddings.position_embeddings",
            "token_embd_norm": "embeddings.LayerNorm",
        },
        _BERT_LAYER,
        "encoder.layer.{}.",
    ),
    "nomic-bert": GGUFLayout(
        _nomic_config, {**_EMBEDDINGS, "token_embd_norm": "emb_ln"}, _NOMIC_LAYER, "encoder.layers.{}."
    ),
    "gemma-embedding": GGUFLayout(
        _gemma_config,
        {"token_embd": "embed_tokens", "output_norm": "norm"},
        _GEMMA_LAYER,
        "layers.{}.",
        norm_shift=1.0,
        skipped=frozenset(f"{d}.weight" for d in GEMMA_DENSE),
    ),
}
