"""The engine's input side: every input as the loaded model reads it, made once, before any
request is queued. A renderer is built per call from the engine's parts (`Engine.renderer`,
engine/render_sides.py's `Renderer` over this `TextRenderer`), so its errors name the model as
the engine that asks does (a server's served name, an adapter's).

    text          strings, token ids, images: the prompt before each, cut or refused at the limit
    static        inference-free SPLADE's queries: no special tokens, no model
    pairs         (query, document) pairs as a reranker reads them (pairs.py)
    classify      texts, text pairs and token ids as a classifier reads them
    multivector   engine/render_sides.py: a query's or a document's token-vector input
    late          engine/render_sides.py: a late-chunked document and its window requests
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from embedserve.config import EngineConfig
from embedserve.engine.multimodal import tokenize_items
from embedserve.errors import InputTooLongError, InvalidInputError
from embedserve.models.registry import CLASSIFIER
from embedserve.models.router import QUERY_PROMPT_NAME
from embedserve.pairs import encode_classify_item, encode_rerank_pair
from embedserve.request import check_dimensions
from embedserve.tokenizer import Tokenized, Tokenizer, Truncate, resolve_prompt

if TYPE_CHECKING:
    from embedserve.engine.builder import EngineParts
    from embedserve.models.score_head import ScoreHead

# A string, or a list of: strings, (text, text_pair) pairs, token-id lists (specials included).
ClassifyInputs = str | Sequence[str | tuple[str, str] | Sequence[int]]


class TextRenderer:
    def __init__(self, parts: EngineParts, name: str) -> None:
        self.parts = parts
        self.config: EngineConfig = parts.config
        self.tokenizer: Tokenizer = parts.tokenizer
        self.name = name  # what errors call the model
        self.multimodal = parts.prompter is not None

    def check_dimensions(self, dimensions: int | None) -> None:
        """InvalidInputError unless `dimensions` is None or a width the model's vectors have."""
        check_dimensions(dimensions, self.config.vector_size, sparse=self.parts.sparse_head is not None)

    def prompt(self, prompt_name: str | None, prompt: str | None) -> str:
        """The text put before each input: a prompt of the model's table by name, a literal one,
        or (neither) the model's default."""
        cfg = self.config
        return resolve_prompt(cfg.prompts, cfg.default_prompt_name, prompt_name, prompt)

    def text(
        self, inputs: Any, prompt: str = "", truncate: str = "error", max_len: int | None = None
    ) -> list[Tokenized]:
        """Tokenize and validate every input (raises naming the first bad one); `max_len`: the
        length over which `truncate` applies (default: the model's max_model_len)."""
        limit = self.config.scheduler.max_model_len if max_len is None else max_len
        return tokenize_items(self.parts.prompter, self.tokenizer, inputs, prompt, limit, truncate, self.name)

    # ---- inference-free queries (engine/static.py answers them) ---------------------------

    def routes_statically(self, prompt_name: str | None) -> bool:
        """Whether inputs with this prompt name skip the model (an inference-free model's queries)."""
        return self.parts.static_queries is not None and prompt_name == QUERY_PROMPT_NAME

    def static(
        self, inputs: str | Sequence[Any], prompt: str = "", truncate: str = "error"
    ) -> list[Tokenized]:
        """Queries as the static module reads them: the prompt before each, no special tokens;
        over its max length refused or cut as `truncate` says."""
        static = self.parts.static_queries
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
            n = static.max_length
            if len(ids) > n and policy is Truncate.ERROR:
                raise InputTooLongError(len(ids), n, index=i)
            cut = ids[:n] if policy is Truncate.END else ids[-n:]
            out.append(Tokenized(token_ids=cut, truncated=len(cut) < len(ids), static=True))
        return out

    # ---- rerankers and classifiers -------------------------------------------------------

    def reranker(self) -> ScoreHead:
        """The model's score head where it reranks; InvalidInputError naming what it is otherwise."""
        head = self.parts.score_head
        if head is None:
            raise InvalidInputError("this model is an embedding model: it cannot rerank")
        labels = head.num_labels
        if head.kind == CLASSIFIER and labels != 1:
            raise InvalidInputError(f"this model classifies into {labels} labels: it cannot rerank")
        return head

    def classifier(self) -> ScoreHead:
        """The model's classifier head; InvalidInputError for a model that cannot classify."""
        head = self.parts.score_head
        if head is None or head.kind != CLASSIFIER:
            what = "an embedding model" if head is None else "a yes / no reranker"
            raise InvalidInputError(f"this model is {what}: it cannot classify")
        return head

    def pairs(
        self, query: str, documents: Sequence[str], truncate: str = "end", instruction: str | None = None
    ) -> list[Tokenized]:
        """Each (query, document) pair as the reranker reads it (pairs.py); all or nothing.
        `truncate`: "end" (default, as CrossEncoder), "start" or "error"; only the document
        is ever cut. `instruction`: Qwen3-Reranker's task line (default: its web-search one)."""
        head = self.reranker()
        policy = Truncate.parse(truncate)
        if isinstance(documents, str) or len(documents) == 0:
            raise InvalidInputError("documents must be a non-empty list of strings")
        limit, types = self.config.scheduler.max_model_len, self.config.model.type_vocab_size > 1
        out = []
        for i, doc in enumerate(documents):
            try:
                out.append(
                    encode_rerank_pair(
                        self.tokenizer, head.kind, query, doc, limit, policy, instruction, types
                    )
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
        self.classifier()
        policy = Truncate.parse(truncate)
        items: Sequence[Any] = [inputs] if isinstance(inputs, str) else inputs
        if len(items) == 0:
            raise InvalidInputError("inputs is empty: pass at least one string, text pair or token list")
        limit, types = self.config.scheduler.max_model_len, self.config.model.type_vocab_size > 1
        out = []
        for i, item in enumerate(items):
            try:
                out.append(encode_classify_item(self.tokenizer, item, limit, policy, types))
            except InputTooLongError as e:
                raise InputTooLongError(e.num_tokens, e.limit, index=i) from None
            except InvalidInputError as e:
                raise InvalidInputError(f"input {i}: {e}") from None
        return out
