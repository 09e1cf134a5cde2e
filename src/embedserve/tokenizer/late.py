"""Late chunking: a document tokenized once, each chunk given the tokens it owns.

    chunks   ["Berlin is ", "the capital. ", "It has 3.8M people."]      (joined exactly)
    tokens   [CLS] berlin is | the capital . | it has 3 . 8 ##m people . [SEP]
    spans    [0 ......... 3) [3 .......... 6) [6 ......................... 15)

A token belongs to the chunk its first non-space character falls in (a token of spaces only:
its first character): a word merged with the space before it goes with the word, a subword
merged across a join goes to the chunk where it starts. Special tokens before the content
join the first span when there is no prompt, those after it the last span, so one chunk pools
exactly as the model's MEAN pooling of the same text; the prompt belongs to no span. A chunk
left without a token of its own is refused (InvalidInputError naming it), unless truncation
cut it off: then it has no vector and the answer skips its index.

Three ways to give the chunks: the chunks' texts in order; the document with character spans
(ascending, disjoint; characters between spans belong to no chunk); or the document with a
chunk size in tokens.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from embedserve.errors import InvalidInputError
from embedserve.pooling.chunks import ChunkSpan, LateChunks, SpanPooling
from embedserve.tokenizer.core import Tokenized, Tokenizer, Truncate


@dataclass(frozen=True)
class LateChunking:
    """How one document is cut into chunks: the chunks' texts in order (a list as the input),
    or the whole text with `chunk_spans` ([start, end) characters) or `chunk_size` (content
    tokens per chunk). `span_pooling`: "mean", or "last" (a causal decoder's last row of each
    span). `long`: a document over max_model_len runs as windows sharing `overlap` content
    tokens (default: an eighth of max_model_len) instead of being refused or cut."""

    chunk_spans: Sequence[Sequence[int]] | None = None
    chunk_size: int | None = None
    span_pooling: str = "mean"
    long: bool = False
    overlap: int | None = None

    @classmethod
    def of_request(cls, req: Any) -> LateChunking:
        """An embeddings request's late-chunking fields (api/protocol.py's EmbeddingRequest), as
        the server runs them and the gateway counts them."""
        return cls(
            req.chunk_spans, req.late_chunk_size, req.span_pooling, req.long_late_chunking, req.late_overlap
        )


def join_chunks(chunks: Sequence[str]) -> tuple[str, list[tuple[int, int]]]:
    """The document the chunks make (joined exactly) and each chunk's character span."""
    if len(chunks) == 0:
        raise InvalidInputError("late chunking needs the document's chunks: input is empty")
    spans: list[tuple[int, int]] = []
    end = 0
    for i, chunk in enumerate(chunks):
        if not isinstance(chunk, str):
            raise InvalidInputError(f"chunk {i}: late chunking takes text, not {type(chunk).__name__}")
        if chunk == "":
            raise InvalidInputError(f"chunk {i} is an empty string")
        spans.append((end, end + len(chunk)))
        end += len(chunk)
    return "".join(chunks), spans


def check_char_spans(spans: Sequence[Sequence[int]], length: int) -> list[tuple[int, int]]:
    """`chunk_spans` as [start, end) character pairs: ascending, disjoint, inside the document."""
    if len(spans) == 0:
        raise InvalidInputError("chunk_spans is empty: give at least one [start, end) span")
    out: list[tuple[int, int]] = []
    end = 0
    for i, span in enumerate(spans):
        if len(span) != 2 or not all(isinstance(x, int) and not isinstance(x, bool) for x in span):
            raise InvalidInputError(f"chunk_spans[{i}] must be two integers [start, end)")
        a, b = span
        if not 0 <= a < b <= length:
            raise InvalidInputError(
                f"chunk_spans[{i}] [{a}, {b}) is empty or outside the document's {length} characters"
            )
        if a < end:
            raise InvalidInputError(f"chunk_spans[{i}] [{a}, {b}) overlaps or precedes the span before it")
        out.append((a, b))
        end = b
    return out


def tokenize_late(
    tokenizer: Tokenizer,
    document: str,
    max_len: int,
    truncate: Truncate,
    *,
    char_spans: Sequence[tuple[int, int]] | None = None,
    chunk_size: int | None = None,
    prompt: str = "",
    pooling: SpanPooling = SpanPooling.MEAN,
) -> Tokenized:
    """`document` (with `prompt` before it) as one sequence whose chunks are `char_spans`, or
    runs of `chunk_size` content tokens; InputTooLongError over `max_len` unless `truncate`."""
    return late_sequence(tokenizer, document, max_len, truncate, char_spans, chunk_size, prompt, pooling)[0]


def late_sequence(
    tokenizer: Tokenizer,
    document: str,
    max_len: int,
    truncate: Truncate,
    char_spans: Sequence[tuple[int, int]] | None,
    chunk_size: int | None,
    prompt: str,
    pooling: SpanPooling,
) -> tuple[Tokenized, tuple[int, int]]:
    """`tokenize_late`'s sequence and the positions [first, end) of its content tokens."""
    if (char_spans is None) == (chunk_size is None):
        raise InvalidInputError("late chunking takes chunk spans or a chunk size: one of them")
    enc, truncated = tokenizer.encoding(document, max_len, truncate, prompt)
    text = prompt + document
    skip = len(prompt)
    content: list[tuple[int, int]] = []  # (position, document character) of each content token
    for pos, (seq, (a, b)) in enumerate(zip(enc.sequence_ids, enc.offsets, strict=True)):
        if seq is None or (skip and b <= skip):  # a special token, or all the prompt's
            continue
        start = max(a, skip)
        first = next((c for c in range(start, b) if not text[c].isspace()), start)
        content.append((pos, first - skip))
    if not content:
        raise InvalidInputError("the document has no content tokens to chunk")
    if chunk_size is not None:
        runs = [content[i : i + chunk_size] for i in range(0, len(content), chunk_size)]
        found = [(i, run, _chars_of(run, enc.offsets, skip)) for i, run in enumerate(runs)]
    else:
        assert char_spans is not None
        found = _by_chars(content, char_spans, truncated)
    positions = len(enc.ids)
    spans = []
    for i, run, chars in found:
        lo, hi = run[0][0], run[-1][0] + 1
        if lo == content[0][0] and enc.sequence_ids[:lo].count(None) == lo:
            lo = 0  # leading special tokens, no prompt before the content
        if hi == content[-1][0] + 1 and enc.sequence_ids[hi:].count(None) == positions - hi:
            hi = positions  # trailing special tokens
        spans.append(ChunkSpan(i, (lo, hi), chars))
    tok = Tokenized(
        token_ids=list(enc.ids),
        truncated=truncated,
        prompt_tokens=content[0][0] if prompt else 0,
        late=LateChunks(tuple(spans), pooling),
    )
    return tok, (content[0][0], content[-1][0] + 1)


def _by_chars(
    content: list[tuple[int, int]], char_spans: Sequence[tuple[int, int]], truncated: bool
) -> list[tuple[int, list[tuple[int, int]], tuple[int, int]]]:
    """Each chunk's content tokens by character; a chunk with none is refused, or skipped where
    truncation cut it off."""
    starts = [a for a, _ in char_spans]
    owned: list[list[tuple[int, int]]] = [[] for _ in char_spans]
    for pos, c in content:
        i = bisect.bisect_right(starts, c) - 1
        if i >= 0 and c < char_spans[i][1]:
            owned[i].append((pos, c))
    kept_lo, kept_hi = content[0][1], content[-1][1]
    found = []
    for i, (run, (a, b)) in enumerate(zip(owned, char_spans, strict=True)):
        if run:
            found.append((i, run, (a, b)))
        elif not (truncated and (b <= kept_lo or a > kept_hi)):
            raise InvalidInputError(
                f"chunk {i} (characters [{a}, {b})) has no token of its own: its characters are "
                "spaces the tokenizer drops or lie inside a token that starts in the chunk before "
                "(a subword merged across the join); move the boundary or join the chunks"
            )
    if not found:
        raise InvalidInputError("no chunk has a token of its own")
    return found


def _chars_of(run: list[tuple[int, int]], offsets: list[tuple[int, int]], skip: int) -> tuple[int, int]:
    """The characters a run of content tokens covers in the document."""
    return max(offsets[run[0][0]][0] - skip, 0), offsets[run[-1][0]][1] - skip


def every_token(tok: Tokenized) -> Tokenized:
    """The input with one span per position: late chunking's MEAN pooling then gives each
    token's final hidden state (TEI's /embed_all, vLLM's token_embed), prompt and special
    tokens included."""
    spans = tuple(ChunkSpan(i, (i, i + 1), (0, 0)) for i in range(len(tok.token_ids)))
    return dataclasses.replace(tok, late=LateChunks(spans, SpanPooling.MEAN))
