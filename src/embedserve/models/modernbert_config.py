"""ModernBERT's `config.json` -> ModelConfig (gte-modernbert, modernbert-embed, ModernBERT-base).

Every `global_attn_every_n_layers`-th layer (from the first; or as `layer_types` says) attends
everywhere with RoPE base `global_rope_theta`; the others within |q - k| <= local_attention / 2
(transformers' bidirectional sliding mask) with `local_rope_theta`. transformers 5 writes the
bases into `rope_parameters` per layer type; both spellings are read.
"""

from __future__ import annotations

from typing import Any

from embedserve.config import ModelConfig
from embedserve.errors import ModelLoadError
from embedserve.models.layer_types import FULL, SLIDING, layer_windows


def modernbert_config(raw: dict[str, Any], archs: list[str]) -> ModelConfig:
    activation = raw.get("hidden_activation", "gelu")
    if activation != "gelu":
        raise ModelLoadError(f"unsupported ModernBERT activation {activation!r}; only gelu (erf form)")
    layers, heads = int(raw["num_hidden_layers"]), int(raw["num_attention_heads"])
    hidden = int(raw["hidden_size"])
    if hidden % heads:
        raise ModelLoadError(f"hidden_size {hidden} is not a multiple of num_attention_heads {heads}")
    every = int(raw.get("global_attn_every_n_layers", 3))
    band = int(raw.get("local_attention", 128)) // 2 + 1  # |q - k| <= local_attention / 2
    windows = layer_windows(raw, layers, band, lambda i: i % every == 0, "ModernBERT")
    full, local = _bases(raw)
    return ModelConfig(
        architecture=archs[0] if archs else "ModernBertModel",
        model_type="modernbert",
        vocab_size=int(raw["vocab_size"]),
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        head_dim=hidden // heads,
        intermediate_size=int(raw["intermediate_size"]),
        max_position_embeddings=int(raw.get("max_position_embeddings", 8192)),
        rms_norm_eps=0.0,
        rope_theta=full,
        qkv_bias=bool(raw.get("attention_bias", False)),
        qk_norm=False,
        is_causal=False,
        layer_norm_eps=float(raw.get("norm_eps", 1e-5)),
        layer_windows=windows,
        local_rope_theta=local,
        attention_scale=(hidden // heads) ** -0.5,
        norm_bias=bool(raw.get("norm_bias", False)),
        mlp_bias=bool(raw.get("mlp_bias", False)),
    )


def _bases(raw: dict[str, Any]) -> tuple[float, float]:
    legacy = raw.get("rope_scaling") or {}  # transformers applies it to both layer types
    if legacy.get("rope_type", legacy.get("type", "default")) != "default":
        raise ModelLoadError(f"ModernBERT rope_scaling {legacy!r} is not implemented; only unscaled RoPE")
    params = raw.get("rope_parameters") or {}
    for kind in (FULL, SLIDING):
        rope_type = (params.get(kind) or {}).get("rope_type", "default")
        if rope_type != "default":
            raise ModelLoadError(
                f"ModernBERT {kind} RoPE {rope_type!r} is not implemented; only unscaled RoPE"
            )
    full = (params.get(FULL) or {}).get("rope_theta") or raw.get("global_rope_theta") or 160_000.0
    local = (params.get(SLIDING) or {}).get("rope_theta") or raw.get("local_rope_theta") or 10_000.0
    return float(full), float(local)
