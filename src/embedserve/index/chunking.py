"""Token-based chunking in the model's own tokenizer.

A chunk holds at most `max_tokens` tokens *as the model sees it* (special tokens included), so
no chunk is ever truncated by the engine. Cuts prefer, in order: a paragraph break, a sentence
end or line break, any whitespace, and only then the middle of a word; but a chunk never ends
before half its budget, so a paragraph break early in the window cannot produce tiny chunks.

    tokens:  s ........................ e        (e - s <= budget, e picked at the best break)
    next:                      e-overlap .... e' (starts at the best break in the overlap)

Chunk text is a slice of the original text (stripped), so it can be shown as it was written.
"""

from __future__ import annotations

from dataclasses import dataclass

from embedserve.errors import InvalidInputError
from embedserve.tokenizer import Tokenizer

# Break classes, best last.
_NONE, _SPACE, _SENTENCE, _PARAGRAPH = 0, 1, 2, 3
_SENTENCE_END = ".!?;:"


@dataclass(frozen=True)
class Chunk:
    text: str
    start: int  # character offsets of `text` in the document
    end: int


def _break_class(text: str, start: int, end: int) -> int:
    """How good a cut just before the token text[start:end] is, from the whitespace in front
    of its first visible character. A whitespace-only token is never a good cut: cuts land on
    the first token of the next word, so the chunk before keeps the whitespace (stripped) and
    an overlap that starts at a good cut always holds text."""
    p = start
    while p < end and text[p].isspace():
        p += 1
    if p == end:
        return _NONE
    a = p
    while a > 0 and text[a - 1].isspace():
        a -= 1
    gap = text[a:p]
    if gap.count("\n") >= 2:
        return _PARAGRAPH
    if gap and ("\n" in gap or (a > 0 and text[a - 1] in _SENTENCE_END)):
        return _SENTENCE
    return _SPACE if gap else _NONE


class Chunker:
    def __init__(self, tokenizer: Tokenizer, max_tokens: int, overlap: int) -> None:
        self.tokenizer = tokenizer
        # Content tokens per chunk: the model's special tokens take the rest.
        self.budget = max_tokens - tokenizer.num_special
        if self.budget < 2:
            raise InvalidInputError(
                f"max_tokens={max_tokens} leaves no room for text after the model's "
                f"{tokenizer.num_special} special tokens"
            )
        if not 0 <= overlap < self.budget // 2:
            raise InvalidInputError(
                f"overlap must be >= 0 and less than half of the {self.budget} text tokens per chunk; "
                f"got {overlap}"
            )
        self.max_tokens = max_tokens
        self.overlap = overlap

    def count(self, text: str) -> int:
        """Content tokens of `text` (special tokens not included)."""
        return len(self.tokenizer.backend.encode(text, add_special_tokens=False).ids)

    def split(self, text: str) -> list[Chunk]:
        offsets = self.tokenizer.backend.encode(text, add_special_tokens=False).offsets
        n = len(offsets)
        # classes[i]: quality of a cut just before token i (i == n: the end of the text).
        classes = [_PARAGRAPH if i in (0, n) else _break_class(text, *offsets[i]) for i in range(n + 1)]
        chunks: list[Chunk] = []
        start = 0
        while start < n:
            end = n if n - start <= self.budget else self._best_end(classes, start)
            chunk, end = self._make(text, offsets, start, end)
            if chunk is not None:
                chunks.append(chunk)
            if end >= n:
                break
            start = self._best_start(classes, start, end)
        return chunks

    def _best_end(self, classes: list[int], start: int) -> int:
        lo, hi = start + self.budget // 2 + 1, start + self.budget
        # Best class wins; among equals the latest cut (the fullest chunk).
        return max(range(lo, hi + 1), key=lambda i: (classes[i], i))

    def _best_start(self, classes: list[int], start: int, end: int) -> int:
        if self.overlap == 0:
            return end
        lo = end - self.overlap
        # Best class wins; among equals the earliest (the most overlap allowed).
        best = max(range(lo, end), key=lambda i: (classes[i], -i))
        return max(best, start + 1)

    def _make(
        self, text: str, offsets: list[tuple[int, int]], start: int, end: int
    ) -> tuple[Chunk | None, int]:
        """The stripped text of tokens [start, end) and the end actually used: shortened when
        re-tokenizing the slice yields more tokens than the budget (a cut can change how
        neighbouring characters merge). None for a whitespace-only span."""
        while True:
            a, b = offsets[start][0], offsets[end - 1][1]
            while a < b and text[a].isspace():
                a += 1
            while b > a and text[b - 1].isspace():
                b -= 1
            if a == b:
                return None, end
            excess = self.count(text[a:b]) - self.budget
            if excess <= 0 or end - start == 1:
                return Chunk(text[a:b], a, b), end
            end = max(end - excess, start + 1)
