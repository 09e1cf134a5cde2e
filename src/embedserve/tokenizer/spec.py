"""What rendering a model's inputs reads of the model, torch-free: one `RenderSpec` per model,
made by the engine from its loaded parts (engine/builder.py) or by the gateway from the model's
files alone (`RenderSpec.of_files`), so both render through the same `Renderer`
(tokenizer/render_sides.py) and a count cannot differ between them by construction."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass, field

from embedserve.config import PoolingMethod
from embedserve.models.multivector_rules import TokenVectors, check_dense_files, read_token_vectors
from embedserve.models.registry import CLASSIFIER, rerank_kind
from embedserve.models.router import StaticQueryTokens
from embedserve.models.source import ModelSource
from embedserve.pooling.outputs import Output, supported_outputs
from embedserve.tokenizer.core import Tokenizer
from embedserve.tokenizer.multimodal import MultimodalPrompter, multimodal_prompter


@dataclass(frozen=True)
class RenderSpec:
    tokenizer: Tokenizer
    # The most tokens an input may have; the gateway's counts have no limit (`of_files`): the
    # full length decides the pool, and each side's limit (multi-vector) is the pool's to apply.
    max_model_len: int
    prompts: Mapping[str, str] = field(default_factory=dict)
    default_prompt_name: str | None = None
    task: str = "embed"  # embed / rerank / classify
    score_kind: str | None = None  # rerankers and classifiers: CLASSIFIER / YES_NO (models/registry.py)
    num_labels: int = 0  # a classifier's labels (0: not a classifier)
    pair_types: bool = False  # the model has a segment table (a pair's second text is type 1)
    causal: bool = False  # attention sees only earlier positions (decoders, Gemma3's causal mask)
    dense_after_pooling: bool = False  # sentence-transformers Dense modules after pooling
    prompter: MultimodalPrompter | None = None  # multimodal models: parts -> tokens + images
    static: StaticQueryTokens | None = None  # inference-free SPLADE's query tokens
    token_vectors: TokenVectors | None = None  # multi-vector models: each side's positions
    vector_size: int = 0  # a dense vector's width (after Dense modules): `dimensions` up to it
    token_dim: int | None = None  # a multi-vector model's token vectors' width (known once loaded)
    outputs: frozenset[Output] = frozenset({Output.DENSE})  # what the model emits (pooling/outputs.py)

    @property
    def sparse(self) -> bool:
        """SPLADE: sparse vectors, which take no `dimensions`."""
        return Output.SPARSE in self.outputs

    @property
    def limited(self) -> bool:
        """Whether inputs are cut or refused at a length (the engine's); not the gateway's counts."""
        return self.max_model_len != sys.maxsize

    @classmethod
    def of_files(cls, source: ModelSource) -> RenderSpec:
        """The spec a model's files give without loading weights or torch (the gateway's counter):
        served as the engine's `task="auto"` serves it, no length limit."""
        model = source.model
        tokenizer = Tokenizer(source.tokenizer(), model.vocab_size)
        kind = rerank_kind(model, source.path)
        labels = len(model.labels)
        mv = source.multivector
        if mv is not None:  # its projection's files, as far as they read without torch
            check_dense_files(mv, model.hidden_size)
        queries = source.query_encoder
        tokens = None if mv is None else read_token_vectors(mv, tokenizer.backend)
        classifies = kind == CLASSIFIER
        outputs = supported_outputs(
            sparse=source.pooling.method is PoolingMethod.SPLADE, lexical=source.lexical_head is not None,
            multivector_only=None if tokens is None else tokens.only,
            scores=kind is not None and (not classifies or labels == 1), labels=classifies,
            text_only=source.multimodal is None,
        )  # fmt: skip
        return cls(
            tokenizer, sys.maxsize, dict(source.prompts), source.default_prompt_name,
            task="embed" if kind is None else "classify" if labels > 1 else "rerank",
            score_kind=kind, num_labels=labels if kind == CLASSIFIER else 0,
            pair_types=model.type_vocab_size > 1,
            causal=model.is_causal or model.causal_mask,
            dense_after_pooling=bool(source.pooling.dense),
            prompter=None if source.multimodal is None else multimodal_prompter(source, None, None),
            static=None if queries is None else StaticQueryTokens(queries, model.vocab_size),
            token_vectors=tokens,
            vector_size=source.pooling.vector_size(model),
            outputs=outputs,
        )  # fmt: skip
