"""Long late chunking: a document longer than the model's input as overlapping macro-windows.

    sequence   [CLS] c0 c1 c2 c3 c4 c5 c6 c7 c8 c9 [SEP]          (content c, W = 6, overlap 2)
    window 0   [CLS] c0 c1 c2 c3 c4 c5 [SEP]        owns [CLS] c0 .. c5
    window 1   [CLS] c4 c5 c6 c7 c8 c9 [SEP]        owns c6 .. c9 [SEP]; reads c4 c5 as context

Every window is the prefix (leading special tokens and the prompt), a run of at most W content
tokens and the suffix (trailing special tokens); consecutive windows share `overlap` content
tokens, which the later one reads as context only, so each position's row comes from exactly
one window. A chunk across a window boundary sums its rows from both: MEAN divides the sum by
the chunk's tokens, LAST reads the row of the window that owns the chunk's last token. Windows
run as ordinary requests whose spans are SUM-pooled portions (pooling/spans.py);
`LongPlan.join` joins them (engine/late.py applies the output head). A document that fits is one window
run as an ordinary late-chunked request.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from embedserve.errors import InvalidInputError
from embedserve.pooling.chunks import ChunkSpan, LateChunks, SpanPooling
from embedserve.tokenizer.core import Tokenized


@dataclass(frozen=True)
class Portion:
    chunk: int  # the chunk's position in the document's spans
    window: int  # the window request it comes from
    span: int  # its span's position among that window's spans


@dataclass(frozen=True)
class LongPlan:
    """A document's window requests and how their rows make its chunks' vectors."""

    document: Tokenized  # the whole sequence with its chunks' spans
    windows: list[Tokenized]  # the requests to run: [document] itself when it fits (`raw` False)
    portions: list[Portion]
    overlap: int  # content tokens consecutive windows share
    max_len: int = 0  # tokens per window (the model's max_model_len)

    @property
    def raw(self) -> bool:
        """Windows answer raw span rows (submit them without dimensions or normalization)."""
        return not (len(self.windows) == 1 and self.windows[0] is self.document)

    @property
    def overlap_tokens(self) -> int:
        """The overlap the windows really shared (0: the document ran as one request)."""
        return self.overlap if self.raw else 0

    @property
    def spans(self) -> tuple[ChunkSpan, ...]:
        assert self.document.late is not None
        return self.document.late.spans

    def join(self, rows: list[np.ndarray]) -> np.ndarray:
        """The chunks' raw vectors from each window's rows (`rows[w]`: [spans of window w, hidden]):
        a chunk across windows sums its portions, MEAN then divides by its tokens. The output
        head applies after (engine/late.py's `join_windows`)."""
        assert self.raw and self.document.late is not None
        acc = np.zeros((len(self.spans), rows[0].shape[1]), dtype=np.float32)
        for p in self.portions:
            acc[p.chunk] += rows[p.window][p.span]
        if self.document.late.pooling is not SpanPooling.LAST:
            acc /= np.array([[b - a] for a, b in (c.tokens for c in self.spans)], dtype=np.float32)
        return acc


def plan_windows(doc: Tokenized, content: tuple[int, int], max_len: int, overlap: int) -> LongPlan:
    """`doc` (late-chunked; its content tokens at positions [c0, c_end)) as windows of at most
    `max_len` tokens sharing `overlap` content tokens; one window when it fits."""
    late, ids = doc.late, doc.token_ids
    assert late is not None
    if len(ids) <= max_len:
        return LongPlan(doc, [doc], [], overlap, max_len)
    c0, c_end = content
    prefix, suffix = ids[:c0], ids[c_end:]
    width = max_len - len(prefix) - len(suffix)
    if width <= 2 * overlap:
        raise InvalidInputError(
            f"a window of max_model_len {max_len} tokens holds {max(width, 0)} of the document's beside "
            f"its {len(prefix) + len(suffix)} prompt and special tokens; the overlap ({overlap} tokens, "
            "late_overlap) must be under half of that: lower it or shorten the prompt"
        )
    last = late.pooling is SpanPooling.LAST
    windows: list[Tokenized] = []
    portions: list[Portion] = []
    start = c0
    while True:
        end = min(start + width, c_end)
        lo, hi = (0 if start == c0 else start + overlap), (len(ids) if end == c_end else end)

        def local(p: int, start: int = start, end: int = end) -> int:
            return p if p < c0 else c0 + (p - start) if p < c_end else c0 + (end - start) + (p - c_end)

        spans: list[ChunkSpan] = []
        for i, c in enumerate(late.spans):
            a, b = max(c.tokens[0], lo), min(c.tokens[1], hi)
            if a < b and not (last and b != c.tokens[1]):  # LAST: the portion with the chunk's end
                portions.append(Portion(i, len(windows), len(spans)))
                spans.append(ChunkSpan(c.index, (local(a), local(b - 1) + 1), c.chars))
        if spans:
            pooling = SpanPooling.LAST if last else SpanPooling.SUM
            window = prefix + ids[start:end] + suffix
            windows.append(
                Tokenized(window, doc.truncated, doc.prompt_tokens, late=LateChunks(tuple(spans), pooling))
            )
        if end == c_end:
            return LongPlan(doc, windows, portions, overlap, max_len)
        start = end - overlap
