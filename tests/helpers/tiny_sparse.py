"""SPLADE fixtures: all-MiniLM-L6-v2's real encoder (from its PyPI package) with a seeded masked-LM
head (the decoder tied to its word embeddings, a bias drawn negative so most terms are zero),
saved by sentence-transformers itself as a SparseEncoder directory (MLMTransformer +
SpladePooling)."""

from __future__ import annotations

from pathlib import Path

import torch

from tests.helpers.tiny_bert import minilm_dir


def build_splade(
    dst: Path, strategy: str = "max", activation: str = "relu", seed: int = 0, positions: int = 512
) -> Path:
    """A SparseEncoder directory at `dst` (built once per path); `positions` over MiniLM's 512:
    its learned position table tiled that far (a long-input SPLADE for benchmarks)."""
    if (dst / "modules.json").exists():
        return dst
    import transformers
    from safetensors.torch import load_file
    from sentence_transformers import SparseEncoder
    from sentence_transformers.sparse_encoder.modules import MLMTransformer, SpladePooling

    src = minilm_dir()
    config = transformers.BertConfig.from_pretrained(src)
    config.max_position_embeddings = positions
    model = transformers.BertForMaskedLM(config)
    encoder = {k.removeprefix("bert."): v for k, v in load_file(src / "model.safetensors").items()}
    encoder.pop("embeddings.position_ids", None)
    table = encoder["embeddings.position_embeddings.weight"]
    encoder["embeddings.position_embeddings.weight"] = table.repeat(-(-positions // len(table)), 1)[
        :positions
    ]
    model.bert.load_state_dict(encoder, strict=False)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        head = model.cls.predictions
        head.transform.dense.weight.copy_(
            0.05 * torch.randn(head.transform.dense.weight.shape, generator=gen)
        )
        head.transform.dense.bias.copy_(0.02 * torch.randn(head.transform.dense.bias.shape, generator=gen))
        head.bias.copy_(-6.0 + 2.0 * torch.randn(head.bias.shape, generator=gen))
    mlm = dst.with_name(dst.name + "-mlm")
    model.save_pretrained(mlm)
    transformers.AutoTokenizer.from_pretrained(src, model_max_length=positions).save_pretrained(mlm)
    transformer = MLMTransformer(str(mlm), max_seq_length=positions)
    enc = SparseEncoder(modules=[transformer, SpladePooling(strategy, activation)], device="cpu")
    enc.save(str(dst))
    return dst


def build_inference_free(dst: Path, splade: Path, seed: int = 0) -> Path:
    """An inference-free SPLADE directory at `dst`: a sentence-transformers Router whose queries
    run a SparseStaticEmbedding (seeded weights, one per vocabulary id) and whose documents run
    `splade`'s MLM checkpoint with max pooling, saved by sentence-transformers itself."""
    if (dst / "modules.json").exists():
        return dst
    from sentence_transformers import SparseEncoder
    from sentence_transformers.base.modules import Router
    from sentence_transformers.sparse_encoder.modules import (
        MLMTransformer,
        SparseStaticEmbedding,
        SpladePooling,
    )

    mlm = MLMTransformer(str(splade.with_name(splade.name + "-mlm")))
    gen = torch.Generator().manual_seed(seed)
    weight = 3.0 * torch.rand(mlm.tokenizer.vocab_size, generator=gen)
    static = SparseStaticEmbedding(tokenizer=mlm.tokenizer, weight=weight, frozen=True)
    router = Router.for_query_document(query_modules=[static], document_modules=[mlm, SpladePooling("max")])
    SparseEncoder(modules=[router], device="cpu", similarity_fn_name="dot").save(str(dst))
    return dst


def build_bge_m3(dst: Path, seed: int = 0) -> Path:
    """A tiny BGE-M3-shaped directory: a random XLM-R encoder (MiniLM's WordPiece vocabulary),
    CLS pooling + Normalize (its dense vectors), and seeded `sparse_linear.pt` and
    `colbert_linear.pt` beside it (its lexical weights and multi-vectors, as BAAI/bge-m3 ships them)."""
    if (dst / "sparse_linear.pt").exists():
        return dst
    import transformers

    from tests.helpers.tiny_bert import TOKENIZER_FILES
    from tests.helpers.tiny_models import write_st_files

    dst.mkdir(parents=True, exist_ok=True)
    config = transformers.XLMRobertaConfig(
        vocab_size=30522, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
        max_position_embeddings=1026, type_vocab_size=1, pad_token_id=0,
    )  # fmt: skip
    model = transformers.XLMRobertaModel(config, add_pooling_layer=False)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            base = 1.0 if "LayerNorm.weight" in name else 0.0
            p.copy_(base + (0.2 if base else 0.3) * torch.randn(p.shape, generator=gen))
    model.save_pretrained(dst, safe_serialization=True)
    for name in TOKENIZER_FILES:
        (dst / name).write_bytes((minilm_dir() / name).read_bytes())
    write_st_files(dst, 64, "cls", True, {}, 1024)
    linear = torch.nn.Linear(64, 1)
    with torch.no_grad():
        linear.weight.copy_(0.1 * torch.randn(linear.weight.shape, generator=gen))
        linear.bias.fill_(0.05)
    torch.save(linear.state_dict(), dst / "sparse_linear.pt")
    colbert = torch.nn.Linear(64, 64)  # its multi-vectors: every token but CLS, projected
    with torch.no_grad():
        colbert.weight.copy_(torch.randn(colbert.weight.shape, generator=gen) / 8)
        colbert.bias.copy_(0.1 * torch.randn(colbert.bias.shape, generator=gen))
    torch.save(colbert.state_dict(), dst / "colbert_linear.pt")
    return dst
