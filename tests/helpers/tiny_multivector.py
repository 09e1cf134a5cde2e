"""Multi-vector (ColBERT) test directories saved by sentence-transformers' own
MultiVectorEncoder: all-MiniLM-L6-v2's real encoder weights and tokenizer, a seeded
`Dense(384 -> 128)` over token embeddings, the punctuation skiplist for documents, query
expansion to 32 tokens and a Normalize module; prompts "[unused0] " / "[unused1] "."""

from __future__ import annotations

import string
from pathlib import Path

import torch

from tests.helpers.tiny_bert import minilm_dir


def build_colbert(dst: Path, *, attend: bool = False, length: int = 32, seed: int = 0) -> Path:
    """Save the directory once (sentence-transformers writes every file: modules.json, 1_Dense,
    2_MultiVectorMask, 3_Normalize, sentence_bert_config.json's query_expansion)."""
    if (dst / "modules.json").exists():
        return dst
    from sentence_transformers import MultiVectorEncoder
    from sentence_transformers.base.modules import Dense, Transformer
    from sentence_transformers.base.modules.normalize import Normalize
    from sentence_transformers.multi_vector_encoder.modules import MultiVectorMask

    expansion = {"strategy": "fixed", "attend": attend, "length": length}
    transformer = Transformer(str(minilm_dir()), query_expansion=expansion, document_length=180)  # type: ignore[arg-type]
    dense = Dense(
        384, 128, bias=False, activation_function=torch.nn.Identity(),
        module_input_name="token_embeddings", module_output_name="token_embeddings",
    )  # fmt: skip
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        dense.linear.weight.copy_(torch.randn(dense.linear.weight.shape, generator=gen) / 384**0.5)
    model = MultiVectorEncoder(
        modules=[
            transformer, dense, MultiVectorMask(skiplist_words=list(string.punctuation)),
            Normalize(module_input_name="token_embeddings"),
        ],
        prompts={"query": "[unused0] ", "document": "[unused1] "},
        device="cpu",
    )  # fmt: skip
    model.save(str(dst))
    return dst
