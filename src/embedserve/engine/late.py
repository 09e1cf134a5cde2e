"""Late chunking on the engine: a document runs as one ordinary request (same batching, token
budget, chunked prefill, preemption, layer-major lane), pooled per chunk span
(pooling/spans.py). `LateChunkingMixin` gives `Engine` its late-chunking methods.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass

import numpy as np

from embedserve.config import PoolingMethod
from embedserve.engine.base import EngineBase
from embedserve.engine.core import Finished
from embedserve.engine.loop import gather_all, wait_all
from embedserve.engine.outputs import output_of
from embedserve.errors import InvalidInputError
from embedserve.late_chunking import check_char_spans, join_chunks, late_sequence
from embedserve.late_long import LongPlan, plan_windows
from embedserve.pooling.spans import ChunkSpan, SpanPooling
from embedserve.tokenizer import Tokenized, Truncate


@dataclass(frozen=True)
class LateChunkOutput:
    embeddings: np.ndarray  # float32 [chunks, dim], one row per entry of `chunks`
    chunks: tuple[ChunkSpan, ...]  # each row's chunk: its index, token and character ranges
    num_tokens: int  # of the whole document as the model read it
    truncated: bool  # the document was cut to max_model_len (cut-off chunks have no row)
    windows: int = 1  # requests it ran as (long documents: overlapping windows)
    overlap: int = 0  # content tokens consecutive windows shared


class LateChunkingMixin(EngineBase):
    """Late chunking: one vector per chunk of a document that ran whole (or as long windows)."""

    def tokenize_late(
        self,
        document: str | Sequence[str],
        *,
        chunk_spans: Sequence[Sequence[int]] | None = None,
        chunk_size: int | None = None,
        span_pooling: str = "mean",
        prompt: str = "",
        truncate: str = "error",
    ) -> Tokenized:
        """One document as one sequence with its chunks' token spans: `document` is the chunks'
        texts in order (joined exactly), or the whole text with `chunk_spans` ([start, end)
        characters) or `chunk_size` (content tokens per chunk). `span_pooling`: "mean", or
        "last" (a causal decoder's last row of each span)."""
        limit = self.config.scheduler.max_model_len
        return self._sequence(document, chunk_spans, chunk_size, span_pooling, prompt, truncate, limit)[0]

    def plan_late(
        self,
        document: str | Sequence[str],
        *,
        chunk_spans: Sequence[Sequence[int]] | None = None,
        chunk_size: int | None = None,
        span_pooling: str = "mean",
        prompt: str = "",
        truncate: str = "error",
        long: bool = False,
        overlap: int | None = None,
    ) -> LongPlan:
        """The requests a late-chunked document runs as: `tokenize_late`'s one sequence, or with
        `long` a document of any length as windows of max_model_len tokens that share `overlap`
        content tokens (default: an eighth of max_model_len), one when it fits (late_long.py)."""
        if not long:
            if overlap is not None:
                raise InvalidInputError("overlap applies to long documents (long=True)")
            tok = self.tokenize_late(
                document, chunk_spans=chunk_spans, chunk_size=chunk_size, span_pooling=span_pooling,
                prompt=prompt, truncate=truncate,
            )  # fmt: skip
            return LongPlan(tok, [tok], [], 0)
        if truncate != "error":
            raise InvalidInputError("a long document runs whole as windows: truncate does not apply")
        limit = self.config.scheduler.max_model_len
        if overlap is None:
            overlap = limit // 8
        if isinstance(overlap, bool) or not isinstance(overlap, int) or overlap < 0:
            raise InvalidInputError(f"late_overlap must be a non-negative integer, got {overlap!r}")
        tok, content = self._sequence(
            document, chunk_spans, chunk_size, span_pooling, prompt, "error", sys.maxsize
        )
        plan = plan_windows(tok, content, limit, overlap)
        if plan.raw and self.dense_head is not None:
            # the windows' rows would each pass the Dense modules before they are joined
            raise InvalidInputError(
                f"model {self.name} has Dense modules after pooling: late chunking takes documents of "
                f"one window ({limit} tokens) for it; shorten or truncate"
            )
        return plan

    def _sequence(
        self,
        document: str | Sequence[str],
        chunk_spans: Sequence[Sequence[int]] | None,
        chunk_size: int | None,
        span_pooling: str,
        prompt: str,
        truncate: str,
        limit: int,
    ) -> tuple[Tokenized, tuple[int, int]]:
        pooling = self._span_pooling(span_pooling)
        policy = Truncate.parse(truncate)
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
        cfg = self.config
        if self.multimodal:
            raise InvalidInputError(f"model {self.name} takes images: late chunking is for text models")
        if cfg.pooling.method is PoolingMethod.SPLADE:
            raise InvalidInputError(
                f"model {self.name} produces sparse vectors: late chunking pools dense rows"
            )
        if cfg.task != "embed":
            raise InvalidInputError(f"model {self.name} is a {cfg.task} model: late chunking embeds")
        pooling = {"mean": SpanPooling.MEAN, "last": SpanPooling.LAST}.get(span_pooling)
        if pooling is None:
            raise InvalidInputError(f"span_pooling must be 'mean' or 'last', got {span_pooling!r}")
        if pooling is SpanPooling.LAST and not (cfg.model.is_causal or cfg.model.causal_mask):
            raise InvalidInputError(
                f"span_pooling 'last' reads each span's last row, which sees only the text before "
                f"it in a causal decoder; model {self.name} is a bidirectional encoder: use 'mean'"
            )
        return pooling

    def embed_late(
        self,
        document: str | Sequence[str],
        *,
        chunk_spans: Sequence[Sequence[int]] | None = None,
        chunk_size: int | None = None,
        span_pooling: str = "mean",
        prompt_name: str | None = None,
        prompt: str | None = None,
        dimensions: int | None = None,
        normalize: bool | None = None,
        priority: str = "online",
        truncate: str = "error",
        long: bool = False,
        overlap: int | None = None,
    ) -> LateChunkOutput:
        """One vector per chunk of `document`, each pooled over its own tokens after the whole
        document ran as one sequence (`tokenize_late`); `long`: a document over max_model_len
        runs as windows sharing `overlap` tokens (`plan_late`) instead of being refused or cut
        (`truncate`). The other options as `Engine.submit`."""
        plan, futures = self._submit_late(
            document, chunk_spans, chunk_size, span_pooling, self.resolve_prompt(prompt_name, prompt),
            truncate, dimensions, normalize, priority, long, overlap,
        )  # fmt: skip
        return self._late_output(plan, wait_all(futures), dimensions, normalize)

    async def embed_late_async(
        self,
        document: str | Sequence[str],
        *,
        chunk_spans: Sequence[Sequence[int]] | None = None,
        chunk_size: int | None = None,
        span_pooling: str = "mean",
        prompt_name: str | None = None,
        prompt: str | None = None,
        dimensions: int | None = None,
        normalize: bool | None = None,
        priority: str = "online",
        truncate: str = "error",
        long: bool = False,
        overlap: int | None = None,
    ) -> LateChunkOutput:
        """`embed_late`, awaited (cancelling it frees the queued document)."""
        plan, futures = self._submit_late(
            document, chunk_spans, chunk_size, span_pooling, self.resolve_prompt(prompt_name, prompt),
            truncate, dimensions, normalize, priority, long, overlap,
        )  # fmt: skip
        return self._late_output(plan, await gather_all(futures), dimensions, normalize)

    def _submit_late(
        self,
        document: str | Sequence[str],
        chunk_spans: Sequence[Sequence[int]] | None,
        chunk_size: int | None,
        span_pooling: str,
        prompt: str,
        truncate: str,
        dimensions: int | None,
        normalize: bool | None,
        priority: str,
        long: bool,
        overlap: int | None,
    ) -> tuple[LongPlan, list[Future[Finished]]]:
        self.check_dimensions(dimensions)  # the windows' rows are sliced after they are joined
        plan = self.plan_late(
            document, chunk_spans=chunk_spans, chunk_size=chunk_size, span_pooling=span_pooling,
            prompt=prompt, truncate=truncate, long=long, overlap=overlap,
        )  # fmt: skip
        if plan.raw:  # each window's raw span rows; the head applies once they are joined
            dimensions, normalize = None, False
        futures = self.submit_tokenized(
            plan.windows, dimensions=dimensions, normalize=normalize, priority=priority
        )
        return plan, futures

    def _late_output(
        self, plan: LongPlan, done: list[Finished], dimensions: int | None, normalize: bool | None
    ) -> LateChunkOutput:
        norm = self.config.pooling.normalize if normalize is None else normalize
        rows = [output_of(fin, tok).embedding for fin, tok in zip(done, plan.windows, strict=True)]
        doc = plan.document
        return LateChunkOutput(
            plan.combine(rows, dimensions, norm), plan.spans, len(doc.token_ids), doc.truncated,
            len(plan.windows), plan.overlap_tokens,
        )  # fmt: skip
