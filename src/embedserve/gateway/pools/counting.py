"""Token counts at the gateway, exactly as the pools' engines will count them.

The counter opens the model the pools serve (directory or .gguf file): its tokenizer (post-processor
special tokens included), its prompt table and default prompt name, and resolves prompts
with the engine's rules, so a routing decision never disagrees with the engine's length check.
Every response's per-input `num_tokens` is compared with these counts (count mismatches metric).
Rerank pairs are counted as the reranker reads them (pairs.py: its pair template or
Qwen3-Reranker's chat template).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from embedserve.api.multimodal import ImageURL, image_size
from embedserve.api.routes import wrong_task
from embedserve.engine.multimodal import MultimodalPrompter, multimodal_prompter, text_items
from embedserve.errors import InvalidInputError
from embedserve.models.multivector_rules import check_dense_files, read_token_vectors
from embedserve.models.open import open_model
from embedserve.models.registry import rerank_kind
from embedserve.models.router import StaticQueryTokens
from embedserve.pairs import encode_classify_item, encode_rerank_pair
from embedserve.tokenizer import Tokenizer, Truncate, resolve_prompt, tokenize_inputs
from embedserve.vision.prompt import ImagePart

# Counting never truncates: the full length decides the pool (and the over-long policy).
_NO_LIMIT = sys.maxsize


class TokenCounter:
    def __init__(self, model_path: str | Path) -> None:
        # A model directory or .gguf file, opened as the engine opens it; weights are not read.
        source = open_model(model_path)
        self.model_path = str(source.path)
        self.tokenizer = Tokenizer(source.tokenizer(), source.model.vocab_size)
        self.prompts = dict(source.prompts)
        self.default_prompt_name = source.default_prompt_name
        self.model_name = source.path.name  # what its refusals call the model (the gateway's name)
        self.rerank_kind = rerank_kind(source.model, source.path)  # None: an embedding model
        self.labels = source.model.labels  # a classifier's, by id
        self._pair_types = source.model.type_vocab_size > 1
        # A multimodal model: its chat format, images counted from their size (vision/prompt.py).
        self.prompter = None if source.multimodal is None else multimodal_prompter(source, None, None)
        # Inference-free SPLADE: its queries are counted as its static module reads them.
        queries = source.query_encoder
        self.static = None if queries is None else StaticQueryTokens(queries, source.model.vocab_size)
        # A multi-vector model: each side's prompt and a query's expansion (models/multivector_rules.py).
        mv = source.multivector
        if mv is not None:  # its projection's files, as far as they read without torch
            check_dense_files(mv, source.model.hidden_size)
        self.multivector = None if mv is None else read_token_vectors(mv, self.tokenizer.backend)

    def count_multivector(
        self, items: Sequence[Any], side: str, prompt_name: str | None, prompt: str | None
    ) -> list[int]:
        """Positions per input on `side` (its prompt, a query's expansion), as the pools read them."""
        head = self.multivector
        if head is None:  # the pool refuses it, naming the model
            return self.count(items, self.resolve_prompt(prompt_name, prompt))
        text_prompt = self.resolve_prompt(head.side_prompt(side, prompt_name, prompt, self.prompts), prompt)
        return [head.read_length(side, n) for n in self.count(items, text_prompt)]

    def resolve_prompt(self, prompt_name: str | None, prompt: str | None) -> str:
        """The engine's rules, shared with it (embedserve.tokenizer.resolve_prompt)."""
        return resolve_prompt(self.prompts, self.default_prompt_name, prompt_name, prompt)

    def count_static(self, items: Sequence[Any], prompt: str) -> list[int]:
        """Inference-free queries' tokens, as the pools count them (engine/static.py)."""
        assert self.static is not None
        return [len(self.static.ids(_text_only(x), prompt, self.tokenizer.backend)) for x in items]

    def count(self, items: Sequence[Any], prompt: str) -> list[int]:
        """Tokens per input (prompt and special tokens included); raises naming the first bad one."""
        if self.prompter is not None:
            return self._count_multimodal(self.prompter, items, prompt)
        items = text_items([_text_only(x) for x in items], self.model_name)
        return [
            len(t.token_ids)
            for t in tokenize_inputs(self.tokenizer, items, prompt, _NO_LIMIT, Truncate.ERROR)
        ]

    def count_pairs(self, query: str, documents: Sequence[str], instruction: str | None) -> list[int]:
        """Tokens per (query, document) pair, uncut; raises naming the first bad document."""
        if self.rerank_kind is None and self.multivector is not None:
            # MaxSim: each document a sequence of its own, the query one more (counted with the first)
            counts = self.count_multivector(documents, "document", None, None)
            counts[0] += self.count_multivector([query], "query", None, None)[0]
            return counts
        if self.rerank_kind is None:
            raise InvalidInputError(wrong_task(self.model_name, "embed"))
        out = []
        for i, doc in enumerate(documents):
            try:
                t = encode_rerank_pair(
                    self.tokenizer, self.rerank_kind, query, doc, _NO_LIMIT, Truncate.ERROR, instruction,
                    self._pair_types,
                )  # fmt: skip
            except InvalidInputError as e:
                raise InvalidInputError(f"document {i}: {e}") from None
            out.append(len(t.token_ids))
        return out

    def count_classify(self, items: Sequence[str | tuple[str, str]]) -> list[int]:
        """Tokens per text or (text, text_pair) pair, as a classifier reads it (engine/classify.py);
        raises naming the first bad input."""
        out = []
        for i, item in enumerate(items):
            try:
                t = encode_classify_item(self.tokenizer, item, _NO_LIMIT, Truncate.ERROR, self._pair_types)
            except InvalidInputError as e:
                raise InvalidInputError(f"input {i}: {e}") from None
            out.append(len(t.token_ids))
        return out

    @staticmethod
    def _count_multimodal(prompter: MultimodalPrompter, items: Sequence[Any], prompt: str) -> list[int]:
        out = []
        for i, item in enumerate(items):
            parts = [item] if isinstance(item, str) else item
            try:
                if not parts or isinstance(parts[0], int):
                    raise InvalidInputError("token-id inputs are not taken by a multimodal model")
                sized = [p if isinstance(p, str) else image_size(p.url) for p in parts]
                out.append(prompter.count(sized, prompt))
            except InvalidInputError as e:
                raise type(e)(f"input {i}: {e}") from None
        return out


def _text_only(item: Any) -> Any:
    """A part list with an image becomes an image marker, so `text_items` refuses it by name."""
    if isinstance(item, list) and any(isinstance(p, ImageURL) for p in item):
        return [ImagePart(b"")]
    return item
