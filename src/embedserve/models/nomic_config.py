"""NomicBert's `config.json` -> ModelConfig, in nomic's spelling (`n_embd`, `n_head`, `n_layer`,
`n_inner`, `rotary_emb_base`, `n_positions`) or transformers' (`hidden_size`, ..., `rope_parameters`).

Positions are plain RoPE, as transformers' NomicBertModel and nomic's code with
`rotary_scaling_factor: null` compute them, up to the trained length (`max_trained_positions`,
else `max_position_embeddings` / `n_positions`): longer inputs follow the truncate policy
(docs/models.md). Anything else nomic's code can be asked for (dynamic NTK scaling, partial or
interleaved rotary, xPos, biases, pre-norm) is refused by name.
"""

from __future__ import annotations

from typing import Any

from embedserve.config import ModelConfig
from embedserve.errors import ModelLoadError

# nomic's flag -> the value this implementation computes
_FIXED: dict[str, Any] = {
    "prenorm": False,
    "qkv_proj_bias": False,
    "mlp_fc1_bias": False,
    "mlp_fc2_bias": False,
    "rotary_emb_interleaved": False,
    "rotary_emb_fraction": 1.0,
    "rotary_scaling_factor": None,  # any factor (1 too) turns on dynamic NTK past 2,048 in nomic's code
    "rotary_emb_scale_base": None,  # xPos
    "scale_attn_weights": True,
    "use_rms_norm": False,
}


def _get(raw: dict[str, Any], *names: str, default: Any = None) -> Any:
    return next((raw[n] for n in names if raw.get(n) is not None), default)


def nomic_config(raw: dict[str, Any], archs: list[str]) -> ModelConfig:
    for key, want in _FIXED.items():
        if key in raw and raw[key] != want:
            raise ModelLoadError(f"NomicBert {key}={raw[key]!r} is not implemented (only {want!r})")
    activation = _get(raw, "hidden_act", "activation_function", default="swiglu")
    if activation not in ("swiglu", "silu"):
        raise ModelLoadError(f"unsupported NomicBert activation {activation!r}; only swiglu")
    hidden = int(_get(raw, "hidden_size", "n_embd"))
    heads = int(_get(raw, "num_attention_heads", "n_head"))
    if hidden % heads:
        raise ModelLoadError(f"hidden_size {hidden} is not a multiple of num_attention_heads {heads}")
    return ModelConfig(
        architecture=archs[0] if archs else "NomicBertModel",
        model_type="nomic_bert",
        vocab_size=int(raw["vocab_size"]),
        hidden_size=hidden,
        num_hidden_layers=int(_get(raw, "num_hidden_layers", "n_layer")),
        num_attention_heads=heads,
        num_key_value_heads=heads,
        head_dim=hidden // heads,
        intermediate_size=int(_get(raw, "intermediate_size", "n_inner", default=4 * hidden)),
        # nomic-embed-text v1 / v1.5 say n_positions 8,192 but were trained to 2,048 (llama.cpp's
        # converter cuts to it too): longer inputs follow the truncate policy, not extrapolated RoPE
        max_position_embeddings=int(
            _get(raw, "max_trained_positions", "max_position_embeddings", "n_positions", default=2048)
        ),
        rms_norm_eps=0.0,
        rope_theta=_theta(raw),
        qkv_bias=False,
        qk_norm=False,
        is_causal=False,
        layer_norm_eps=float(_get(raw, "layer_norm_eps", "layer_norm_epsilon", default=1e-12)),
        type_vocab_size=int(raw.get("type_vocab_size", 2)),
    )


def _theta(raw: dict[str, Any]) -> float:
    params = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in ("default", None):
        raise ModelLoadError(f"NomicBert RoPE scaling {kind!r} is not implemented; only unscaled RoPE")
    return float(
        _get(params, "rope_theta", default=None) or _get(raw, "rope_theta", "rotary_emb_base") or 1000.0
    )
