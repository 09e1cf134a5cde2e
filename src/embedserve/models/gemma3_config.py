"""Gemma 3 text models' `config.json` -> ModelConfig (EmbeddingGemma and the causal LMs).

What differs from the decoders the registry reads:

* `layer_types`: "sliding_attention" layers see a band of keys, "full_attention" layers all of
  them. Transformers' masks, which these windows must equal:
    causal:        0 <= q - k < sliding_window
    bidirectional: |q - k| < sliding_window // 2 + 1   (EmbeddingGemma: 512 -> |q - k| <= 256)
* two RoPE bases: `rope_theta` on full layers (optionally linear-scaled), `rope_local_base_freq`
  on sliding ones (or both inside `rope_parameters`, transformers 5's spelling);
* scores scaled by `query_pre_attn_scalar ** -0.5`, not head_dim's.

The model runs every input whole (no KV cache, never chunked), as encoders do: `is_causal` stays
False and `causal_mask` says which mask its attention uses.
"""

from __future__ import annotations

from typing import Any

from embedserve.config import ModelConfig
from embedserve.errors import ModelLoadError
from embedserve.models.layer_types import FULL, SLIDING, layer_windows

_ACTIVATIONS = ("gelu_pytorch_tanh", "gelu_tanh")


def gemma3_config(raw: dict[str, Any], archs: list[str]) -> ModelConfig:
    activation = raw.get("hidden_activation") or raw.get("hidden_act") or "gelu_pytorch_tanh"
    if activation not in _ACTIVATIONS:
        raise ModelLoadError(f"unsupported Gemma3 activation {activation!r}; only gelu_pytorch_tanh")
    if raw.get("attn_logit_softcapping") is not None:
        raise ModelLoadError("Gemma3 attn_logit_softcapping is not implemented (Gemma 3 configs set none)")
    layers = int(raw["num_hidden_layers"])
    bidirectional = bool(raw.get("use_bidirectional_attention", False))
    window = int(raw.get("sliding_window") or 0)
    band = window // 2 + 1 if bidirectional else window
    pattern = int(raw.get("sliding_window_pattern") or raw.get("_sliding_window_pattern") or 6)
    windows = layer_windows(raw, layers, band if window else 0, lambda i: (i + 1) % pattern == 0, "Gemma3")
    full, local, factor = _rope(raw)
    heads = int(raw["num_attention_heads"])
    head_dim = int(raw.get("head_dim") or 256)  # transformers' Gemma3TextConfig defaults
    return ModelConfig(
        architecture=archs[0] if archs else "Gemma3TextModel",
        model_type="gemma3_text",
        vocab_size=int(raw["vocab_size"]),
        hidden_size=int(raw["hidden_size"]),
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=int(raw.get("num_key_value_heads") or heads),
        head_dim=head_dim,
        intermediate_size=int(raw["intermediate_size"]),
        max_position_embeddings=int(raw.get("max_position_embeddings", 32768)),
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
        rope_theta=full,
        qkv_bias=bool(raw.get("attention_bias", False)),
        qk_norm=True,
        tie_word_embeddings=True,
        is_causal=False,
        layer_windows=windows,
        local_rope_theta=local,
        attention_scale=float(raw.get("query_pre_attn_scalar") or 256) ** -0.5,
        rope_factor=factor,
        causal_mask=not bidirectional,
    )


def _rope(raw: dict[str, Any]) -> tuple[float, float, float]:
    """(full layers' base, sliding layers' base, full layers' linear factor)."""
    full_theta = float(raw.get("rope_theta") or 1e6)
    local_theta = float(raw.get("rope_local_base_freq") or 1e4)
    params = raw.get("rope_parameters")
    if isinstance(params, dict) and FULL in params:  # transformers 5: one entry per layer type
        full, local = params[FULL] or {}, params.get(SLIDING) or {}
        if local.get("rope_type", "default") != "default":
            raise ModelLoadError(f"Gemma3 sliding layers' RoPE {local.get('rope_type')!r} is not implemented")
        return (
            float(full.get("rope_theta", full_theta)),
            float(local.get("rope_theta", local_theta)),
            _factor(full),
        )
    # a flat rope_parameters is not read by transformers' Gemma3 either
    return full_theta, local_theta, _factor(raw.get("rope_scaling") or {})


def _factor(params: dict[str, Any]) -> float:
    kind = params.get("rope_type", params.get("type", "default"))
    if kind in ("default", None):
        return 1.0
    if kind == "linear":
        return float(params["factor"])
    raise ModelLoadError(f"Gemma3 RoPE scaling {kind!r} is not implemented; default and linear are")
