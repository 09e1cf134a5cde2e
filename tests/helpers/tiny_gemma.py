"""Tiny random-weight Gemma3 text models saved as sentence-transformers directories.

EmbeddingGemma's shape in small: bidirectional attention, sliding layers with a band narrower
than the test inputs (so the windows matter), two RoPE bases, query_pre_attn_scalar != head_dim,
one KV head for three query heads; mean pooling with the prompt, Dense hidden -> 4 * hidden ->
hidden (no bias), Normalize. The causal variant is a Gemma3 LM read with last-token pooling.
The tokenizer is all-MiniLM-L6-v2's WordPiece (offline); the architecture is what is tested.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch

from tests.helpers.tiny_bert import TOKENIZER_FILES, minilm_dir
from tests.helpers.tiny_models import write_st_files

PROMPTS = {
    "query": "task: search result | query: ",
    "document": "title: none | text: ",
    "Classification": "task: classification | query: ",  # EmbeddingGemma's case
}


def build_gemma3(
    dst: Path,
    *,
    bidirectional: bool = True,
    window: int = 16,
    dense: tuple[int, ...] = (384, 96),
    dense_bias: bool = False,
    activation: str = "torch.nn.modules.linear.Identity",
    pooling: str = "mean",
    seed: int = 0,
    max_seq_length: int = 512,
    layer_types: tuple[str, ...] = (
        "sliding_attention",
        "full_attention",
        "sliding_attention",
        "sliding_attention",
    ),
    query_pre_attn_scalar: int = 24,
) -> Path:
    """`window`: config.json's sliding_window (bidirectional: |q - k| <= window // 2);
    `dense`: the Dense modules' output widths after pooling (none: ())."""
    import transformers

    if (dst / "config.json").exists():
        return dst
    dst.mkdir(parents=True, exist_ok=True)
    hidden = 96
    config = transformers.Gemma3TextConfig(
        vocab_size=30522,
        hidden_size=hidden,
        intermediate_size=96,
        num_hidden_layers=len(layer_types),
        num_attention_heads=3,
        num_key_value_heads=1,
        head_dim=40,  # != hidden / heads
        query_pre_attn_scalar=query_pre_attn_scalar,
        max_position_embeddings=1024,
        sliding_window=window,
        layer_types=list(layer_types),
        rope_theta=1e6,
        rope_local_base_freq=1e4,
        use_bidirectional_attention=bidirectional,
        pad_token_id=0,
    )
    model = transformers.Gemma3TextModel(config)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            std = 0.2 if "norm" in name else 0.5 if "embed" in name else 0.15
            p.copy_(std * torch.randn(p.shape, generator=gen))
    model.save_pretrained(dst, safe_serialization=True)
    for name in TOKENIZER_FILES:
        shutil.copy(minilm_dir() / name, dst / name)
    write_st_files(dst, hidden, pooling, True, PROMPTS, max_seq_length)
    _write_dense(dst, hidden, dense, dense_bias, activation, gen)
    return dst


def _write_dense(
    dst: Path, hidden: int, widths: tuple[int, ...], bias: bool, activation: str, gen: torch.Generator
) -> None:
    """Dense modules between Pooling and Normalize, as sentence-transformers saves them."""
    from safetensors.torch import save_file

    if not widths:
        return
    modules: list[dict[str, Any]] = json.loads((dst / "modules.json").read_text())
    normalize = [m for m in modules if m["type"].endswith("Normalize")]
    modules = [m for m in modules if not m["type"].endswith("Normalize")]
    width = hidden
    for out in widths:
        folder = f"{len(modules)}_Dense"
        modules.append(
            {"idx": len(modules), "name": str(len(modules)), "path": folder,
             "type": "sentence_transformers.models.Dense"}
        )  # fmt: skip
        (dst / folder).mkdir()
        cfg = {"in_features": width, "out_features": out, "bias": bias, "activation_function": activation}
        (dst / folder / "config.json").write_text(json.dumps(cfg))
        state = {"linear.weight": torch.randn(out, width, generator=gen) / width**0.5}
        if bias:
            state["linear.bias"] = 0.1 * torch.randn(out, generator=gen)
        save_file(state, str(dst / folder / "model.safetensors"))
        width = out
    for m in normalize:
        modules.append({**m, "idx": len(modules), "name": str(len(modules))})
    (dst / "modules.json").write_text(json.dumps(modules))
