"""Late chunking in the indexer (`embedserve index --late-chunking`).

A document's chunks (the chunker's, `--overlap 0`) are grouped into windows of consecutive
chunks that fit the model's input; each window is one late-chunked request (the window's text
with its chunks' character spans), so each chunk's vector carries the context of its window,
the whole document when it fits:

    document  [c0 c1 c2 c3 c4 c5 c6]          chunks of <= --max-tokens
    windows   [c0 c1 c2 c3] [c4 c5 c6]        each <= the model's max_model_len

A chunk's stored text hash covers its window's text, so editing one chunk re-embeds every
chunk of its window (their vectors saw the edit), and the later windows of that document too
where the edit moved their boundaries; windows depend only on the document, so a resumed run
embeds the same windows.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
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
    text: str, chunks: Sequence[Chunk], count: Callable[[str], int], budget: int
) -> list[tuple[Window, int]]:
    """Each chunk's window and its position in it; `count`: a text's content tokens (the
    chunker's), `budget`: content tokens per window (the model's input limit less its special
    tokens and the document prompt). A window grows chunk by chunk on the chunks' counts, then
    shrinks until its own text (with the gaps between the chunks) fits."""
    counts = [count(c.text) for c in chunks]
    placed: list[tuple[Window, int]] = []
    i = 0
    while i < len(chunks):
        j, total = i + 1, counts[i]
        while j < len(chunks) and total + counts[j] + 1 <= budget:  # + 1: the gap's token, if any
            total += counts[j] + 1
            j += 1
        while j > i + 1 and count(text[chunks[i].start : chunks[j - 1].end]) > budget:
            j -= 1
        lo = chunks[i].start
        window = Window(text[lo : chunks[j - 1].end], tuple((c.start - lo, c.end - lo) for c in chunks[i:j]))
        placed += [(window, pos) for pos in range(j - i)]
        i = j
    return placed


def chunk_overlap(overlap: int | None, late: bool) -> int:
    """--overlap: by default 64 tokens, none for late chunking (each chunk sees its document)."""
    if overlap is not None:
        return overlap
    return 0 if late else 64


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
