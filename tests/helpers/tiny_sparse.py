"""SPLADE fixtures: all-MiniLM-L6-v2's real encoder (from its PyPI package) with a seeded masked-LM
head (the decoder tied to its word embeddings, a bias drawn negative so most terms are zero),
saved by sentence-transformers itself as a SparseEncoder directory (MLMTransformer +
SpladePooling)."""

from __future__ import annotations

from pathlib import Path

import torch

from tests.helpers.tiny_bert import minilm_dir


def build_splade(dst: Path, strategy: str = "max", activation: str = "relu", seed: int = 0) -> Path:
    """A SparseEncoder directory at `dst` (built once per path)."""
    if (dst / "modules.json").exists():
        return dst
    import transformers
    from safetensors.torch import load_file
    from sentence_transformers import SparseEncoder
    from sentence_transformers.sparse_encoder.modules import MLMTransformer, SpladePooling

    src = minilm_dir()
    config = transformers.BertConfig.from_pretrained(src)
    model = transformers.BertForMaskedLM(config)
    encoder = {k.removeprefix("bert."): v for k, v in load_file(src / "model.safetensors").items()}
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
    transformers.AutoTokenizer.from_pretrained(src).save_pretrained(mlm)
    enc = SparseEncoder(modules=[MLMTransformer(str(mlm)), SpladePooling(strategy, activation)], device="cpu")
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
