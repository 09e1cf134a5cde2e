"""Inference-free SPLADE: a sentence-transformers `Router` directory whose documents run a SPLADE
model and whose queries run none.

    modules.json          [Router]
    router_config.json    structure: {"query": ["query_0_SparseStaticEmbedding"],
                                      "document": ["document_0_MLMTransformer", "document_1_SpladePooling"]}
    document_0_MLMTransformer/   the *ForMaskedLM checkpoint, its tokenizer
    document_1_SpladePooling/    the pooling's config
    query_0_SparseStaticEmbedding/model.safetensors   `weight`: one weight per vocabulary id

A query's vector is the weight of each vocabulary id its tokens hold (once each; the tokenizer
without special tokens, cut at its max length), as sentence-transformers' SparseStaticEmbedding
computes it: no forward pass. Documents are the SPLADE model's, as for any SparseEncoder.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer as HFTokenizer

from embedserve.errors import InvalidInputError, ModelLoadError
from embedserve.models.tensor_header import tensor_shape

QUERY_PROMPT_NAME = "query"  # the route a request asks for with prompt_name / input_type


@dataclass(frozen=True)
class RouterDirs:
    document: Path  # the SPLADE checkpoint (MLMTransformer)
    pooling: Path  # SpladePooling's folder
    query: Path  # SparseStaticEmbedding's folder


def router_dirs(root: Path) -> RouterDirs | None:
    """The folders of an inference-free SPLADE Router directory, or None for another directory."""
    modules_file, config_file = root / "modules.json", root / "router_config.json"
    if not (modules_file.exists() and config_file.exists()):
        return None
    modules = json.loads(modules_file.read_text(encoding="utf-8"))
    if len(modules) != 1 or not str(modules[0].get("type", "")).endswith("Router"):
        return None
    config = json.loads(config_file.read_text(encoding="utf-8"))
    types, structure = config.get("types", {}), config.get("structure", {})
    kinds = {route: [str(types.get(m, "")).rsplit(".", 1)[-1] for m in ms] for route, ms in structure.items()}
    want = {"query": ["SparseStaticEmbedding"], "document": ["MLMTransformer", "SpladePooling"]}
    if kinds != want:
        raise ModelLoadError(
            f"{root}: a Router directory is served as inference-free SPLADE only (query: "
            f"SparseStaticEmbedding; document: MLMTransformer, SpladePooling); it holds {kinds}"
        )
    doc, pool = structure["document"]
    return RouterDirs(root / doc, root / pool, root / structure["query"][0])


class StaticQueryTokens:
    """How inference-free queries are tokenized (the static module's own tokenizer, if saved);
    no weights, no torch: the gateway counts with it (models/static_queries.py adds the weights)."""

    def __init__(self, folder: Path, vocab_size: int | None = None) -> None:
        """`vocab_size`: check the weights' shape from their file's header (the gateway's check;
        StaticQueries reads the weights themselves)."""
        if vocab_size is not None:
            shape = tensor_shape(folder / "model.safetensors", "weight")
            check_static_weight(folder, vocab_size, shape)
        tokenizer_file = folder / "tokenizer.json"
        self.tokenizer = HFTokenizer.from_file(str(tokenizer_file)) if tokenizer_file.exists() else None
        if self.tokenizer is not None:  # a saved tokenizer may pad to a length: ids of [PAD] would count
            self.tokenizer.no_padding()
            self.tokenizer.no_truncation()
        config = folder / "tokenizer_config.json"
        cfg = json.loads(config.read_text(encoding="utf-8")) if config.exists() else {}
        limit = cfg.get("model_max_length", 512)
        self.max_length = int(limit) if isinstance(limit, (int, float)) and limit < 1e9 else 512

    def ids(self, text: str, prompt: str, fallback: HFTokenizer) -> list[int]:
        """The query's token ids as the static module reads them: the prompt before it, no
        special tokens, uncut (the caller applies the truncation policy at `max_length`)."""
        if not isinstance(text, str) or text == "":
            raise InvalidInputError("a query is a non-empty string")
        return list((self.tokenizer or fallback).encode(prompt + text, add_special_tokens=False).ids)


def check_static_weight(folder: Path, vocab_size: int, shape: tuple[int, ...] | None) -> None:
    """One weight per vocabulary id, or a ModelLoadError naming what the file holds."""
    if shape is None or len(shape) != 1 or shape[0] != vocab_size:
        raise ModelLoadError(
            f"{folder}: expected a `weight` of {vocab_size} values (one per vocabulary id), got {shape}"
        )
