"""Tiny random-weight rerankers: BERT / XLM-R cross-encoders (as CrossEncoder loads them; with
`labels`, classifiers of those labels) and a Qwen3 causal LM with the real Qwen tokenizer in a
directory named like Qwen3-Reranker."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch

from tests.helpers.tiny_bert import TOKENIZER_FILES, minilm_dir
from tests.helpers.tiny_models import qwen_tokenizer_dir


def _randomize(model: torch.nn.Module, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "LayerNorm.weight" in name or "norm.weight" in name:
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(0.3 * torch.randn(p.shape, generator=gen))


def build_cross_encoder(
    dst: Path,
    kind: str = "bert",
    hidden: int = 64,
    seed: int = 0,
    labels: list[str] | None = None,
    problem_type: str | None = None,
) -> Path:
    """A BertForSequenceClassification / XLMRobertaForSequenceClassification: one label, or
    `labels` (id2label in that order) with `problem_type` (e.g. "multi_label_classification")."""
    import transformers

    dst.mkdir(parents=True, exist_ok=True)
    common: dict[str, Any] = {
        "vocab_size": 30522,
        "hidden_size": hidden,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": 2 * hidden,
        "num_labels": 1,
    }
    if labels is not None:
        common["id2label"] = dict(enumerate(labels))
        common["label2id"] = {name: i for i, name in enumerate(labels)}
        common["problem_type"] = problem_type
        del common["num_labels"]
    model: torch.nn.Module
    if kind == "bert":
        config = transformers.BertConfig(**common, max_position_embeddings=512, type_vocab_size=2)
        model = transformers.BertForSequenceClassification(config)
    else:  # XLM-R layout: positions after padding_idx, one token type
        config = transformers.XLMRobertaConfig(
            **common, max_position_embeddings=514, type_vocab_size=1, pad_token_id=0
        )
        model = transformers.XLMRobertaForSequenceClassification(config)
    _randomize(model, seed)
    model.save_pretrained(dst, safe_serialization=True)
    for name in TOKENIZER_FILES:
        shutil.copy(minilm_dir() / name, dst / name)
    cfg = json.loads((dst / "tokenizer_config.json").read_text())
    cfg["model_max_length"] = 512
    if kind != "bert":  # as XLM-R's own tokenizer: no token_type_ids for the model
        cfg["model_input_names"] = ["input_ids", "attention_mask"]
    (dst / "tokenizer_config.json").write_text(json.dumps(cfg))
    return dst


def build_qwen3_reranker(dst: Path, hidden: int = 64, seed: int = 0) -> Path:
    """Qwen3ForCausalLM (untied lm_head) with the real Qwen tokenizer, no sentence-transformers files."""
    import transformers

    dst.mkdir(parents=True, exist_ok=True)
    config = transformers.Qwen3Config(
        vocab_size=151669,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=8192,
        rope_theta=1e6,
        tie_word_embeddings=False,
    )
    model = transformers.Qwen3ForCausalLM(config)
    _randomize(model, seed)
    with torch.no_grad():  # small embeddings: a random LM of this vocab stays well-conditioned
        model.model.embed_tokens.weight.mul_(0.1)
    model.save_pretrained(dst, safe_serialization=True)
    files = qwen_tokenizer_dir()  # its post-processor adds nothing, as the reranker's
    for name in ("tokenizer.json", "vocab.json", "merges.txt", "tokenizer_config.json"):
        shutil.copy(files / name, dst / name)
    return dst
