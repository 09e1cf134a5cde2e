"""Instantiate an opened model's architecture (models/open.py) with its weights loaded."""

from __future__ import annotations

import torch

from embedserve.attention.metadata import AttentionFn
from embedserve.attention.select import select_attention
from embedserve.models.bert import EncoderModel
from embedserve.models.decoder import DecoderModel
from embedserve.models.gemma3 import Gemma3Model
from embedserve.models.modernbert import ModernBertModel
from embedserve.models.nomic_bert import NomicBertModel
from embedserve.models.qwen3_vl.model import Qwen3VLModel
from embedserve.models.source import ModelSource

EmbeddingModel = DecoderModel | EncoderModel | Gemma3Model | NomicBertModel | ModernBertModel


def build_model(
    source: ModelSource, device: torch.device, dtype: torch.dtype, attention: AttentionFn | None = None
) -> EmbeddingModel:
    """The model with its weights; a decoder attends with `attention`, by default the route
    `select_attention` picks for (device, dtype), chosen here once."""
    cfg = source.model
    model: EmbeddingModel
    if cfg.is_causal and attention is None:
        attention = select_attention(device, dtype)  # outside "meta": its self-check computes
    with torch.device("meta"):  # no memory until the real weights arrive
        if source.multimodal is not None:
            assert attention is not None
            model = Qwen3VLModel(cfg, source.multimodal, attention)
        elif cfg.is_causal:
            assert attention is not None
            model = DecoderModel(cfg, attention)
        elif cfg.model_type == "gemma3_text":
            model = Gemma3Model(cfg)
        elif cfg.model_type == "nomic_bert":
            model = NomicBertModel(cfg)
        elif cfg.model_type == "modernbert":
            model = ModernBertModel(cfg)
        else:
            model = EncoderModel(cfg)
    model = model.to_empty(device=device).to(dtype)
    model.load_weights(source.weights())
    return model.eval()
