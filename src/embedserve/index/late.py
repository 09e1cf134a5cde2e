"""Late chunking in the indexer (`embedserve index --late-chunking`).

A document's chunks (the chunker's, `--overlap 0`) are grouped into windows of consecutive
chunks that fit the model's input; each window is one late-chunked request (the window's text
with its chunks' character spans), so each chunk's vector carries the context of its window,
the whole document when it fits:

    document  [c0 c1 c2 c3 c4 c5 c6]          chunks of <= --max-tokens
    windows   [c0 c1 c2 c3] [c4 c5 c6]        each <= the model's max_model_len

A chunk's stored text hash covers its window's text, so editing one chunk re-embeds every
chunk of its window (their vectors saw the edit); windows depend only on the document, so a
resumed run embeds the same windows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from embedserve.index.chunking import Chunk
from embedserve.index.errors import StoreError


@dataclass(frozen=True)
class Window:
    """Consecutive chunks of one document as one late-chunked request."""

    text: str  # the document's characters from the first chunk's start to the last one's end
    spans: tuple[tuple[int, int], ...]  # each chunk's [start, end) characters in `text`


def late_windows(
    text: str, chunks: Sequence[Chunk], counts: Sequence[int], budget: int
) -> list[tuple[Window, int]]:
    """Each chunk's window and its position in it; `counts`: each chunk's content tokens,
    `budget`: content tokens per window (the model's input limit less its special tokens)."""
    runs: list[list[int]] = []
    total = budget + 1
    for i, n in enumerate(counts):
        if total + n > budget:
            runs.append([])
            total = 0
        runs[-1].append(i)
        total += n
    placed: list[tuple[Window, int]] = []
    for run in runs:
        lo, hi = chunks[run[0]].start, chunks[run[-1]].end
        window = Window(text[lo:hi], tuple((chunks[i].start - lo, chunks[i].end - lo) for i in run))
        placed += [(window, pos) for pos in range(len(run))]
    return placed


def check_late_chunker(overlap: int) -> None:
    if overlap:
        raise StoreError(
            f"--late-chunking embeds each chunk inside its document: chunks may not overlap (--overlap "
            f"{overlap}); pass --overlap 0"
        )


def embed_late_rows(chunks: dict[str, np.ndarray], todo: Sequence[int], embedder: Any) -> np.ndarray:
    """The vectors of the chunks at `todo`: every window holding one of them embedded once
    (`embedder.embed_late_documents`), each chunk's row taken from its window's."""
    windows: dict[Window, list[int]] = {}
    for i in todo:
        windows.setdefault(chunks["window"][i], []).append(i)
    found = embedder.embed_late_documents([(w.text, list(w.spans)) for w in windows])
    out = np.zeros((len(todo), embedder.dimension), dtype=np.float32)
    row = {i: k for k, i in enumerate(todo)}
    for rows, members in zip(found, windows.values(), strict=True):
        for i in members:
            out[row[i]] = rows[int(chunks["window_pos"][i])]
    return out
