"""A late-chunked document's spans, torch-free: which token positions each chunk owns and how
they are pooled; the renderer makes them (tokenizer/late.py), pooling/spans.py pools them."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class SpanPooling(str, enum.Enum):
    MEAN = "mean"
    LAST = "last"  # the span's last row: only meaningful where attention is causal
    SUM = "sum"  # the rows' sum: a part of a chunk whose other rows another window has (tokenizer/windows.py)


@dataclass(frozen=True)
class ChunkSpan:
    """One chunk of a late-chunked document."""

    index: int  # the chunk's position in the request (a truncated document may drop some)
    tokens: tuple[int, int]  # [start, end) positions in the token sequence
    chars: tuple[int, int]  # [start, end) characters in the document


@dataclass(frozen=True)
class LateChunks:
    """A document's chunk spans (ascending, disjoint, none empty) and how each is pooled."""

    spans: tuple[ChunkSpan, ...]
    pooling: SpanPooling = SpanPooling.MEAN

    def __post_init__(self) -> None:
        if not self.spans:
            raise ValueError("late chunking needs at least one span")
        end = 0
        for s in self.spans:
            a, b = s.tokens
            if not end <= a < b:
                raise ValueError(f"span {s.index} {s.tokens} is empty or overlaps the one before")
            end = b
