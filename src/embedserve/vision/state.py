"""A multimodal request's state: where its images sit in the prompt, its M-RoPE positions
(computed once, at admission) and its encoder cache (filled by the runner, freed on preemption).

    tokens:    <|im_start|> ... <|vision_start|> [img img img img img img] <|vision_end|> ...
    index:      0               s-1               s                s+5    s+6
    positions: (p, p, p)        (c-1)x3           (c, c+i, c+j) for the 2x3 token grid
               text after the image resumes at c + max(2, 3), i.e. the image's max + 1

The scheduler only asks `cut` where a chunk may end (never inside an image span); the runner
asks `images_in` which images a chunk holds and keeps their tower rows in `encoder_cache`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from embedserve.vision.image import ProcessedImage

if TYPE_CHECKING:  # the cache holds tensors; building a prompt's state needs no torch
    import torch


@dataclass(frozen=True)
class ImageSpan:
    start: int  # prompt index of the image's first token
    image: ProcessedImage

    @property
    def end(self) -> int:
        return self.start + self.image.num_tokens

    @property
    def llm_grid(self) -> tuple[int, int]:
        """(rows, columns) of the image's tokens."""
        _, h, w = self.image.grid
        return h // self.image.merge, w // self.image.merge


def mrope_positions(length: int, spans: list[ImageSpan]) -> np.ndarray:
    """[3, length] int64 (t, h, w) positions: text (p, p, p); an image (c, c + row, c + col)
    with c where the text before it ended; text after it resumes at c + max(rows, cols)."""
    pos = np.empty((3, length), dtype=np.int64)
    cur = 0  # next position
    i = 0  # next token index
    for span in sorted(spans, key=lambda s: s.start):
        n_text = span.start - i
        pos[:, i : span.start] = cur + np.arange(n_text, dtype=np.int64)
        cur += n_text
        rows, cols = span.llm_grid
        hh, ww = np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")
        pos[0, span.start : span.end] = cur
        pos[1, span.start : span.end] = cur + hh.reshape(-1)
        pos[2, span.start : span.end] = cur + ww.reshape(-1)
        cur += max(rows, cols)
        i = span.end
    pos[:, i:] = cur + np.arange(length - i, dtype=np.int64)
    return pos


@dataclass
class MultimodalState:
    spans: list[ImageSpan]
    positions: np.ndarray  # [3, num_prompt_tokens], see `mrope_positions`
    # image index -> its tower rows [num_tokens, hidden * (1 + deepstack)]: [main | ds_1 .. ds_k]
    encoder_cache: dict[int, torch.Tensor] = field(default_factory=dict)

    @classmethod
    def of(cls, length: int, spans: list[ImageSpan]) -> MultimodalState:
        return cls(spans, mrope_positions(length, spans))

    @property
    def num_image_tokens(self) -> int:
        return sum(s.image.num_tokens for s in self.spans)

    def cut(self, start: int, n: int) -> int:
        """The largest m <= n such that chunk [start, start + m) splits no image: a cut inside
        an image moves before it (0 when the chunk would start inside one, which never
        happens: every chunk starts at a cut)."""
        end = start + n
        for span in self.spans:
            if span.start < end < span.end:
                return max(span.start - start, 0)
        return n

    def images_in(self, start: int, n: int) -> list[int]:
        """Indices of the images inside chunk [start, start + n) (whole, by `cut`)."""
        found = []
        for k, span in enumerate(self.spans):
            if span.start < start + n and span.end > start:
                assert start <= span.start and span.end <= start + n, "a chunk split an image"
                found.append(k)
        return found

    def fresh(self) -> MultimodalState:
        """The same images and positions with an empty encoder cache (one per request)."""
        return MultimodalState(self.spans, self.positions)

    def release(self) -> None:
        """Drop the encoder cache (preemption recomputes the tower; a finished request needs none)."""
        self.encoder_cache.clear()
