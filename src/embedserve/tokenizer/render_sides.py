"""The renderer's structured inputs, over tokenizer/render.py's texts: a multi-vector model's query
or document side, and a late-chunked document with the window requests it runs as. `Renderer`
is what `Engine.renderer` gives and what the gateway counts with."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from embedserve.errors import InvalidInputError
from embedserve.models.multivector_rules import TokenVectors
from embedserve.pooling.chunks import SpanPooling
from embedserve.tokenizer.core import Tokenized, Truncate
from embedserve.tokenizer.late import LateChunking, check_char_spans, join_chunks, late_sequence
from embedserve.tokenizer.render import TextRenderer, check_width
from embedserve.tokenizer.windows import LongPlan, plan_windows

SIDES = ("query", "document")


@dataclass(frozen=True)
class MultiVectorInput:
    """One input as the model reads it on its side: tokens (a query's expansion included),
    which positions give a vector, and how many positions are keys (None: all)."""

    tokenized: Tokenized
    side: str
    keep: list[bool]
    attend_keys: int | None

    @property
    def num_vectors(self) -> int:
        return sum(self.keep)


class Renderer(TextRenderer):
    """Every input kind the loaded model takes (tokenizer/render.py's, and these)."""

    # ---- multi-vector models ---------------------------------------------------------------

    def token_head(self) -> TokenVectors:
        head = self.spec.token_vectors
        if head is None:
            raise InvalidInputError(
                f"model {self.name} gives one vector per input: it has no multi-vector head "
                "(a ColBERT Dense module or BGE-M3's colbert_linear.pt)"
            )
        return head

    def check_vector_dimensions(self, dimensions: int | None) -> None:
        self.token_head()
        dim = self.spec.token_dim
        assert dim is not None, "a loaded model's spec knows its token vectors' width"
        if dimensions is not None:
            check_width(dimensions, dim)

    def multivector(
        self,
        inputs: str | Sequence[Any],
        side: str = "document",
        *,
        prompt_name: str | None = None,
        prompt: str | None = None,
        truncate: str = "error",
    ) -> list[MultiVectorInput]:
        """Each input as the model reads it on `side` ("query" or "document"): the side's prompt
        (unless one is named), its length limit (a query's expansion length, a document's
        document_length), a query padded with the expansion token, the skiplist applied."""
        head = self.token_head()
        if side not in SIDES:
            raise InvalidInputError(f"input_type must be 'query' or 'document', got {side!r}")
        first = inputs[0] if not isinstance(inputs, str) and len(inputs) else None
        as_ids = isinstance(first, (list, tuple)) and all(isinstance(x, int) for x in first)
        prompts = {} if as_ids else dict(self.spec.prompts)  # token-id inputs take no side prompt
        text_prompt = self.prompt(head.side_prompt(side, prompt_name, prompt, prompts), prompt)
        max_len = head.side_limit(side, self.spec.max_model_len) if self.spec.limited else sys.maxsize
        expansion = head.expansion if side == "query" else None
        out: list[MultiVectorInput] = []
        for tok in self.text(inputs, text_prompt, truncate, max_len):
            ids, keys = tok.token_ids, None
            if expansion is not None and len(ids) < expansion.length and tok.multimodal is not None:
                raise InvalidInputError(
                    f"input {len(out)}: query expansion pads text queries, not image ones"
                )
            if expansion is not None and len(ids) < expansion.length:
                keys = None if expansion.attend else len(ids)
                ids = ids + [expansion.token_id] * (head.read_length(side, len(ids)) - len(ids))
                tok = replace(tok, token_ids=ids)
            if keys is not None and self.spec.causal:
                raise InvalidInputError(
                    f"model {self.name}: query expansion without attention needs an encoder"
                )
            keep = head.keeps(ids, side)
            if not any(keep):
                raise InvalidInputError(
                    f"input {len(out)}: no token of it gives a vector ({len(ids)} tokens)"
                )
            out.append(MultiVectorInput(tok, side, keep, keys))
        return out

    # ---- late chunking ---------------------------------------------------------------------

    def late(
        self, document: str | Sequence[str], late: LateChunking, prompt: str = "", truncate: str = "error"
    ) -> LongPlan:
        """The requests a late-chunked document runs as: one sequence with its chunks' token
        spans, or with `late.long` a document of any length as windows of max_model_len tokens
        that share `late.overlap` content tokens, one when it fits (tokenizer/windows.py)."""
        limit = self.spec.max_model_len
        if not late.long:
            if late.overlap is not None:
                raise InvalidInputError("overlap applies to long documents (long=True)")
            tok = self._sequence(document, late, prompt, truncate, limit)[0]
            return LongPlan(tok, [tok], [], 0)
        if truncate != "error":
            raise InvalidInputError("a long document runs whole as windows: truncate does not apply")
        overlap = limit // 8 if late.overlap is None else late.overlap
        if isinstance(overlap, bool) or not isinstance(overlap, int) or overlap < 0:
            raise InvalidInputError(f"late_overlap must be a non-negative integer, got {overlap!r}")
        tok, content = self._sequence(document, late, prompt, "error", sys.maxsize)
        plan = plan_windows(tok, content, limit, overlap)
        if plan.raw and self.spec.dense_after_pooling:
            # the windows' rows would each pass the Dense modules before they are joined
            raise InvalidInputError(
                f"model {self.name} has Dense modules after pooling: late chunking takes documents of "
                f"one window ({limit} tokens) for it; shorten or truncate"
            )
        return plan

    def _sequence(
        self, document: str | Sequence[str], late: LateChunking, prompt: str, truncate: str, limit: int
    ) -> tuple[Tokenized, tuple[int, int]]:
        pooling = self._span_pooling(late.span_pooling)
        policy = Truncate.parse(truncate)
        chunk_spans, chunk_size = late.chunk_spans, late.chunk_size
        if chunk_size is not None and (isinstance(chunk_size, bool) or not isinstance(chunk_size, int)):
            raise InvalidInputError(f"chunk_size must be a positive integer, got {chunk_size!r}")
        if chunk_size is not None and chunk_size < 1:
            raise InvalidInputError(f"chunk_size must be a positive integer, got {chunk_size}")
        if isinstance(document, str):
            if (chunk_spans is None) == (chunk_size is None):
                raise InvalidInputError("a whole document takes chunk_spans or a chunk size (one of them)")
            if document == "":
                raise InvalidInputError("the document is an empty string")
            spans = None if chunk_spans is None else check_char_spans(chunk_spans, len(document))
            return late_sequence(self.tokenizer, document, limit, policy, spans, chunk_size, prompt, pooling)
        if chunk_spans is not None or chunk_size is not None:
            raise InvalidInputError(
                "chunk_spans and chunk_size go with a whole document, not a list of chunks"
            )
        text, spans = join_chunks(document)
        return late_sequence(self.tokenizer, text, limit, policy, spans, None, prompt, pooling)

    def _span_pooling(self, span_pooling: str) -> SpanPooling:
        spec = self.spec
        if self.multimodal:
            raise InvalidInputError(f"model {self.name} takes images: late chunking is for text models")
        if spec.sparse:
            raise InvalidInputError(
                f"model {self.name} produces sparse vectors: late chunking pools dense rows"
            )
        if spec.task != "embed":
            raise InvalidInputError(f"model {self.name} is a {spec.task} model: late chunking embeds")
        pooling = {"mean": SpanPooling.MEAN, "last": SpanPooling.LAST}.get(span_pooling)
        if pooling is None:
            raise InvalidInputError(f"span_pooling must be 'mean' or 'last', got {span_pooling!r}")
        if pooling is SpanPooling.LAST and not spec.causal:
            raise InvalidInputError(
                f"span_pooling 'last' reads each span's last row, which sees only the text before "
                f"it in a causal decoder; model {self.name} is a bidirectional encoder: use 'mean'"
            )
        return pooling
