"""Supported architectures and how their `config.json` maps onto ModelConfig."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from embedserve.config import ModelConfig
from embedserve.errors import ModelLoadError
from embedserve.models.gemma3_config import gemma3_config
from embedserve.models.modernbert_config import modernbert_config
from embedserve.models.nomic_config import nomic_config

# model_type -> (q/k per-head RMSNorm, q/k/v bias)
DECODERS: dict[str, tuple[bool, bool]] = {
    "qwen3": (True, False),
    "qwen2": (False, True),
    "llama": (False, False),
    "mistral": (False, False),
    "qwen3_vl": (True, False),  # the text decoder of Qwen3-VL (models/qwen3_vl/)
}

ARCHITECTURES: dict[str, str] = {
    "Qwen3ForCausalLM": "qwen3",
    "Qwen3Model": "qwen3",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen2Model": "qwen2",
    "LlamaForCausalLM": "llama",
    "LlamaModel": "llama",
    "MistralForCausalLM": "mistral",
    "MistralModel": "mistral",
    "Qwen3VLForConditionalGeneration": "qwen3_vl",
    "Qwen3VLModel": "qwen3_vl",
    "BertModel": "bert",
    "BertForMaskedLM": "bert",
    "RobertaModel": "roberta",
    "RobertaForMaskedLM": "roberta",
    "XLMRobertaModel": "xlm-roberta",
    "XLMRobertaForMaskedLM": "xlm-roberta",
    # EmbeddingGemma (bidirectional) and Gemma 3 text LMs (models/gemma3.py)
    "Gemma3TextModel": "gemma3_text",
    "Gemma3ForCausalLM": "gemma3_text",
    "NomicBertModel": "nomic_bert",  # nomic-embed-text v1 / v1.5 (models/nomic_bert.py)
    "NomicBertForPreTraining": "nomic_bert",
    "NomicBertForMaskedLM": "nomic_bert",
    "ModernBertModel": "modernbert",  # gte-modernbert, modernbert-embed (models/modernbert.py)
    "ModernBertForMaskedLM": "modernbert",
    "MPNetModel": "mpnet",
    "MPNetForMaskedLM": "mpnet",
    # cross-encoders (rerank) and classifiers: the encoder + a classifier head (models/score_head.py)
    "BertForSequenceClassification": "bert",
    "RobertaForSequenceClassification": "roberta",
    "XLMRobertaForSequenceClassification": "xlm-roberta",
}

# model_type -> whether absolute positions start after the padding index (RoBERTa's layout)
ENCODERS: dict[str, bool] = {"bert": False, "roberta": True, "xlm-roberta": True, "mpnet": True}

# transformers' MPNet buckets relative positions into 32 whatever its table's size
# (compute_position_bias' default; models/relative_bias.py)
RELATIVE_BUCKETS = 32


def supported() -> str:
    return ", ".join(sorted(ARCHITECTURES))


def _rope_theta(raw: dict[str, Any]) -> float:
    """rope_theta from either the classic top-level key or the newer `rope_parameters`."""
    params = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in ("default", None):
        raise ModelLoadError(
            f"RoPE scaling {rope_type!r} is not implemented; only unscaled RoPE is supported"
        )
    theta = raw.get("rope_theta", params.get("rope_theta"))
    if theta is None:
        raise ModelLoadError("config.json has no rope_theta")
    return float(theta)


def sliding_window(raw: dict[str, Any]) -> int | None:
    """The attention window if the config turns one on, else None."""
    window = raw.get("sliding_window")
    if window is None:
        return None
    if raw.get("model_type") in ("qwen2", "qwen3") and not raw.get("use_sliding_window", False):
        return None
    if raw.get("model_type") == "gemma3_text":
        return None  # its windows are computed (models/gemma3.py), they do not cap the length
    return int(window)


def model_config_from_hf(raw: dict[str, Any]) -> ModelConfig:
    if (
        raw.get("model_type") == "qwen3_vl"
        or ARCHITECTURES.get((raw.get("architectures") or [""])[0]) == "qwen3_vl"
    ):
        raw = _vl_text_config(raw)
    archs = raw.get("architectures") or []
    model_type = raw.get("model_type")
    for arch in archs:
        if arch in ARCHITECTURES:
            model_type = ARCHITECTURES[arch]
            break
    if model_type in ENCODERS:
        return _encoder_config(raw, str(model_type), archs)
    if model_type == "gemma3_text":
        return gemma3_config(raw, archs)
    if model_type == "nomic_bert":
        return nomic_config(raw, archs)
    if model_type == "modernbert":
        return modernbert_config(raw, archs)
    if model_type not in DECODERS:
        named = ", ".join(archs) or str(model_type)
        raise ModelLoadError(f"unsupported architecture {named}; supported: {supported()}")
    if raw.get("hidden_act", "silu") != "silu":
        raise ModelLoadError(f"unsupported activation {raw['hidden_act']!r}; only silu")
    qk_norm, qkv_bias = DECODERS[model_type]
    heads = int(raw["num_attention_heads"])
    hidden = int(raw["hidden_size"])
    return ModelConfig(
        **_shared_fields(raw, model_type, archs),
        num_key_value_heads=int(raw.get("num_key_value_heads") or heads),
        # Qwen3 sets head_dim explicitly (it is not hidden / heads there).
        head_dim=int(raw.get("head_dim") or hidden // heads),
        max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
        rope_theta=_rope_theta(raw),
        qkv_bias=bool(raw.get("attention_bias", qkv_bias)) or qkv_bias,
        qk_norm=qk_norm,
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
    )


def _shared_fields(raw: dict[str, Any], model_type: str, archs: list[str]) -> dict[str, Any]:
    """ModelConfig fields that decoders and encoders read the same way."""
    return {
        "architecture": archs[0] if archs else model_type,
        "model_type": model_type,
        "vocab_size": int(raw["vocab_size"]),
        "hidden_size": int(raw["hidden_size"]),
        "num_hidden_layers": int(raw["num_hidden_layers"]),
        "num_attention_heads": int(raw["num_attention_heads"]),
        "intermediate_size": int(raw["intermediate_size"]),
    }


def _encoder_config(raw: dict[str, Any], model_type: str, archs: list[str]) -> ModelConfig:
    """BERT family: absolute positions, post-LN, exact (erf) GELU, bidirectional attention."""
    if raw.get("hidden_act", "gelu") != "gelu":
        raise ModelLoadError(f"unsupported encoder activation {raw['hidden_act']!r}; only gelu (erf form)")
    position_type = raw.get("position_embedding_type", "absolute")
    if position_type != "absolute":
        raise ModelLoadError(f"position_embedding_type {position_type!r} is not supported; only absolute")
    heads = int(raw["num_attention_heads"])
    hidden = int(raw["hidden_size"])
    if hidden % heads:
        raise ModelLoadError(f"hidden_size {hidden} is not a multiple of num_attention_heads {heads}")
    # RoBERTa's first real position id is padding_idx + 1; the rows below it are never used.
    offset = int(raw.get("pad_token_id", 1)) + 1 if ENCODERS[model_type] else 0
    if model_type == "mpnet":
        offset = 2  # transformers' MPNet pads with id 1 whatever the config says
    return ModelConfig(
        **_shared_fields(raw, model_type, archs),
        num_key_value_heads=heads,
        head_dim=hidden // heads,
        max_position_embeddings=int(raw.get("max_position_embeddings", 512)) - offset,
        rms_norm_eps=0.0,  # decoder-only fields: encoders use LayerNorm and no RoPE
        rope_theta=0.0,
        qkv_bias=True,
        qk_norm=False,
        is_causal=False,
        layer_norm_eps=float(raw.get("layer_norm_eps", 1e-12)),
        # MPNet has no segment embeddings; its scores take a bucketed relative position bias
        type_vocab_size=0 if model_type == "mpnet" else int(raw.get("type_vocab_size", 2)),
        position_offset=offset,
        relative_attention_buckets=_mpnet_buckets(raw) if model_type == "mpnet" else 0,
        **(_classifier_fields(raw) if archs and archs[0].endswith("ForSequenceClassification") else {}),
    )


def _mpnet_buckets(raw: dict[str, Any]) -> int:
    rows = int(raw.get("relative_attention_num_buckets", 32))
    if rows < RELATIVE_BUCKETS:  # transformers buckets into 32 whatever the table's size
        raise ModelLoadError(
            f"MPNet relative_attention_num_buckets must be at least {RELATIVE_BUCKETS}, got {rows}"
        )
    return rows


def _classifier_fields(raw: dict[str, Any]) -> dict[str, Any]:
    """A classifier's labels as transformers reads them: id2label's names by id (a missing id is
    "LABEL_i"), else `num_labels` (default 2) labels "LABEL_i"; and its problem_type."""
    given = raw.get("id2label")
    try:
        names = {int(k): str(v) for k, v in given.items()} if isinstance(given, dict) and given else {}
        count = len(names) if names else int(raw.get("num_labels") or 2)
    except (TypeError, ValueError):
        raise ModelLoadError(f"config.json's id2label / num_labels cannot be read: {given!r}") from None
    if count < 1:
        raise ModelLoadError(f"config.json's classifier has {count} labels")
    problem = raw.get("problem_type")
    return {
        "labels": tuple(names.get(i, f"LABEL_{i}") for i in range(count)),
        "problem_type": str(problem) if problem else None,
    }


def _vl_text_config(raw: dict[str, Any]) -> dict[str, Any]:
    """Qwen3-VL: the decoder's numbers are under text_config (the vision tower's: models/qwen3_vl/)."""
    if not isinstance(raw.get("text_config"), dict):
        raise ModelLoadError("a Qwen3-VL config.json needs a text_config")
    archs = raw.get("architectures") or ["Qwen3VLModel"]
    return {**raw["text_config"], "architectures": archs, "model_type": "qwen3_vl"}


# What a score head reads (models/score_head.py): a cross-encoder's or classifier's labels, or a
# yes / no reranker's two LM-head rows
CLASSIFIER = "classifier"
YES_NO = "yes_no"


def rerank_kind(model: ModelConfig, path: Path) -> str | None:
    """A *ForSequenceClassification encoder is a cross-encoder; a causal LM whose directory is
    named like Qwen3-Reranker ("reranker" in its name) is a yes / no reranker; else None."""
    if model.architecture.endswith("ForSequenceClassification"):
        return CLASSIFIER
    if model.is_causal and "reranker" in path.name.lower():
        return YES_NO
    return None
