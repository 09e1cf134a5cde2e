"""Every input as the model reads it, made once, before any request is queued, torch-free: the
engine renders its inputs (`Engine.renderer`) and the gateway counts them (gateway/pools/
counting.py) through the same `Renderer` (tokenizer/render_sides.py, over this `TextRenderer`)
on a `RenderSpec` (tokenizer/spec.py). Errors name the model as the caller serves it.

    text          strings, token ids, images: the prompt before each, cut or refused at the limit
    count         `text`'s lengths; a multimodal model's images counted from their sizes
    static        inference-free SPLADE's queries: no special tokens, no model
    pairs         (query, document) pairs as a reranker reads them (tokenizer/pairs.py)
    classify      texts, text pairs and token ids as a classifier reads them
    multivector   tokenizer/render_sides.py: a query's or a document's token-vector input
    late          tokenizer/render_sides.py: a late-chunked document and its window requests
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any

from embedserve.errors import InputTooLongError, InvalidInputError
from embedserve.models.registry import CLASSIFIER
from embedserve.models.router import QUERY_PROMPT_NAME
from embedserve.tokenizer.core import Tokenized, Truncate, resolve_prompt
from embedserve.tokenizer.multimodal import tokenize_items
from embedserve.tokenizer.pairs import encode_classify_item, encode_rerank_pair
from embedserve.tokenizer.spec import RenderSpec

# A string, or a list of: strings, (text, text_pair) pairs, token-id lists (specials included).
ClassifyInputs = str | Sequence[str | tuple[str, str] | Sequence[int]]


class TextRenderer:
    def __init__(self, spec: RenderSpec, name: str) -> None:
        self.spec = spec
        self.tokenizer = spec.tokenizer
        self.name = name  # what errors call the model
        self.multimodal = spec.prompter is not None

    def check_dimensions(self, dimensions: int | None) -> None:
        """InvalidInputError unless `dimensions` is None or a width the model's vectors have (after
        Dense modules); a SPLADE model's sparse vectors take none."""
        if dimensions is None:
            return
        if self.spec.sparse:
            raise InvalidInputError("dimensions does not apply to a SPLADE model's sparse vectors")
        check_width(dimensions, self.spec.vector_size)

    def prompt(self, prompt_name: str | None, prompt: str | None) -> str:
        """The text put before each input: a prompt of the model's table by name, a literal one,
        or (neither) the model's default."""
        spec = self.spec
        return resolve_prompt(spec.prompts, spec.default_prompt_name, prompt_name, prompt)

    def text(
        self, inputs: Any, prompt: str = "", truncate: str = "error", max_len: int | None = None
    ) -> list[Tokenized]:
        """Tokenize and validate every input (raises naming the first bad one); `max_len`: the
        length over which `truncate` applies (default: the model's max_model_len)."""
        limit = self.spec.max_model_len if max_len is None else max_len
        return tokenize_items(self.spec.prompter, self.tokenizer, inputs, prompt, limit, truncate, self.name)

    def count(
        self, inputs: Sequence[Any], prompt: str, size_of: Callable[[Any], tuple[int, int]]
    ) -> list[int]:
        """Tokens per input as `text` renders it (prompt and special tokens included); a
        multimodal model's image parts counted from their (width, height), `size_of(part)`,
        without decoding a pixel (vision/prompt.py); raises naming the first bad input."""
        prompter = self.spec.prompter
        if prompter is None:
            return [len(t.token_ids) for t in self.text(inputs, prompt)]
        out = []
        for i, item in enumerate(inputs):
            parts = [item] if isinstance(item, str) else item
            try:
                if not parts or isinstance(parts[0], int):
                    raise InvalidInputError("token-id inputs are not taken by a multimodal model")
                out.append(prompter.count([p if isinstance(p, str) else size_of(p) for p in parts], prompt))
            except InvalidInputError as e:
                raise type(e)(f"input {i}: {e}") from None
        return out

    # ---- inference-free queries (engine/static.py answers them) ---------------------------

    def routes_statically(self, prompt_name: str | None) -> bool:
        """Whether inputs with this prompt name skip the model (an inference-free model's queries)."""
        return self.spec.static is not None and prompt_name == QUERY_PROMPT_NAME

    def static(
        self, inputs: str | Sequence[Any], prompt: str = "", truncate: str = "error"
    ) -> list[Tokenized]:
        """Queries as the static module reads them: the prompt before each, no special tokens;
        over its max length refused or cut as `truncate` says."""
        static = self.spec.static
        assert static is not None
        policy = Truncate.parse(truncate)
        items: Sequence[Any] = [inputs] if isinstance(inputs, str) else inputs
        if len(items) == 0:
            raise InvalidInputError("inputs is empty: pass at least one string")
        out = []
        for i, text in enumerate(items):
            try:
                ids = static.ids(text, prompt, self.tokenizer.backend)
            except InvalidInputError as e:
                raise InvalidInputError(f"input {i}: {e}") from None
            n = static.max_length if self.spec.limited else sys.maxsize
            if len(ids) > n and policy is Truncate.ERROR:
                raise InputTooLongError(len(ids), n, index=i)
            cut = ids[:n] if policy is Truncate.END else ids[-n:]
            out.append(Tokenized(token_ids=cut, truncated=len(cut) < len(ids), static=True))
        return out

    # ---- rerankers and classifiers -------------------------------------------------------

    def check_reranks(self) -> str:
        """The score head's kind where the model reranks; InvalidInputError naming what it is otherwise."""
        kind = self.spec.score_kind
        if kind is None:
            raise InvalidInputError("this model is an embedding model: it cannot rerank")
        labels = self.spec.num_labels
        if kind == CLASSIFIER and labels != 1:
            raise InvalidInputError(f"this model classifies into {labels} labels: it cannot rerank")
        return kind

    def check_classifies(self) -> None:
        """InvalidInputError for a model that cannot classify."""
        kind = self.spec.score_kind
        if kind != CLASSIFIER:
            what = "an embedding model" if kind is None else "a yes / no reranker"
            raise InvalidInputError(f"this model is {what}: it cannot classify")

    def pairs(
        self, query: str, documents: Sequence[str], truncate: str = "end", instruction: str | None = None
    ) -> list[Tokenized]:
        """Each (query, document) pair as the reranker reads it (tokenizer/pairs.py); all or nothing.
        `truncate`: "end" (default, as CrossEncoder), "start" or "error"; only the document
        is ever cut. `instruction`: Qwen3-Reranker's task line (default: its web-search one)."""
        kind = self.check_reranks()
        policy = Truncate.parse(truncate)
        if isinstance(documents, str) or len(documents) == 0:
            raise InvalidInputError("documents must be a non-empty list of strings")
        limit, types = self.spec.max_model_len, self.spec.pair_types
        out = []
        for i, doc in enumerate(documents):
            try:
                out.append(
                    encode_rerank_pair(self.tokenizer, kind, query, doc, limit, policy, instruction, types)
                )
            except InputTooLongError as e:
                raise InputTooLongError(e.num_tokens, e.limit, index=i) from None
            except InvalidInputError as e:
                raise InvalidInputError(f"document {i}: {e}") from None
        return out

    def classify(self, inputs: ClassifyInputs, truncate: str = "error") -> list[Tokenized]:
        """Each input as the classifier reads it; all or nothing (InvalidInputError naming the
        first bad one). `inputs`: a string, or a list of strings, (text, text_pair) pairs (the
        tokenizer's pair template, as a cross-encoder reads one; only the second text is cut) and
        token-id lists. `truncate`: "error" (default: an input over max_model_len is refused),
        "end" or "start" (cut that end of the text, keeping the special tokens)."""
        self.check_classifies()
        policy = Truncate.parse(truncate)
        items: Sequence[Any] = [inputs] if isinstance(inputs, str) else inputs
        if len(items) == 0:
            raise InvalidInputError("inputs is empty: pass at least one string, text pair or token list")
        limit, types = self.spec.max_model_len, self.spec.pair_types
        out = []
        for i, item in enumerate(items):
            try:
                out.append(encode_classify_item(self.tokenizer, item, limit, policy, types))
            except InputTooLongError as e:
                raise InputTooLongError(e.num_tokens, e.limit, index=i) from None
            except InvalidInputError as e:
                raise InvalidInputError(f"input {i}: {e}") from None
        return out


def check_width(dimensions: object, width: int) -> None:
    """InvalidInputError unless `dimensions` is an integer in [1, width]."""
    if isinstance(dimensions, bool) or not isinstance(dimensions, int) or not 1 <= dimensions <= width:
        raise InvalidInputError(f"dimensions must be an integer in [1, {width}], got {dimensions!r}")
