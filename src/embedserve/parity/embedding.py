"""Feeding one side of a dataset through a backend: length-sorted batches and a progress bar."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from tqdm import tqdm

from embedserve.embedders.modeldir import TokenCounter
from embedserve.parity.backends import Backend
from embedserve.parity.cache import VectorCache
from embedserve.parity.datasets import Item, Parts
from embedserve.parity.options import ParityError

MAX_PAD_RATIO = 1.25


@dataclass
class Timing:
    seconds: float = 0.0
    tokens: int = 0  # tokens embedded (after truncation to the limit)
    cached: int = 0  # items read from the vector cache instead (not timed)

    def add(self, other: Timing) -> None:
        self.seconds += other.seconds
        self.tokens += other.tokens
        self.cached += other.cached

    def as_dict(self) -> dict[str, float]:
        rate = self.tokens / self.seconds if self.seconds > 0 else 0.0
        return {
            "seconds": round(self.seconds, 3),
            "tokens": self.tokens,
            "tokens_per_s": round(rate, 1),
            "cached_items": self.cached,
        }


def measure(counter: TokenCounter, items: Sequence[Item], prompt: str) -> list[int]:
    """Tokens each item is as the model sees it (prompt and special tokens included)."""
    if any(isinstance(i, Parts) for i in items):  # the chat format; the prompt is the instruction
        return [len(i) if isinstance(i, tuple) else counter.count_parts(_parts(i), prompt) for i in items]
    texts = [prompt + i for i in items if isinstance(i, str)]
    counted = iter(counter.count_many(texts)) if texts else iter(())
    return [len(i) if isinstance(i, tuple) else next(counted) for i in items]


def _parts(item: str | Parts) -> tuple[str | bytes, ...]:
    return item.parts if isinstance(item, Parts) else (item,)


def embed_side(
    backend: Backend,
    items: Sequence[Item],
    prompt: str,
    lengths: Sequence[int],
    limit: int | None,
    desc: str,
    progress: bool,
    cache: VectorCache | None = None,
    role: str = "document",
) -> tuple[np.ndarray, Timing]:
    """Embed in length order (similar lengths batch with little padding); rows in input order;
    `role`: the dataset side ("query" or "document": a `sided` backend embeds them apart).

    With a cache and a backend that declares an identity, stored vectors are reused.
    """
    identity = backend.cache_identity() if cache is not None else None
    keyed = f"{role}|{prompt}" if backend.sided else prompt  # a sided model's roles differ
    key = VectorCache.key(identity, keyed, items) if identity else ""
    if cache is not None and key:
        stored = cache.load(key, len(items))
        if stored is not None:
            return stored, Timing(cached=len(items))
    effective = [min(n, limit) if limit else n for n in lengths]  # tokens after truncation
    bar = tqdm(total=sum(effective), unit="tok", unit_scale=True, desc=desc, disable=not progress)
    with bar:
        vectors, timing = _embed_batches(backend, items, prompt, role, effective, bar)
    if cache is not None and key:
        cache.store(key, vectors)
    return vectors, timing


def _embed_batches(
    backend: Backend, items: Sequence[Item], prompt: str, role: str, effective: Sequence[int], bar: tqdm
) -> tuple[np.ndarray, Timing]:
    order = sorted(range(len(items)), key=lambda i: effective[i])
    rows: list[np.ndarray | None] = [None] * len(items)
    timing = Timing()

    def flush(batch: list[int]) -> None:
        start = time.perf_counter()
        vectors = backend.embed_as([items[i] for i in batch], prompt, role)
        timing.seconds += time.perf_counter() - start
        if vectors.ndim != 2 or vectors.shape[0] != len(batch):
            raise ParityError(f"{backend.spec}: returned {vectors.shape} for {len(batch)} inputs")
        for i, v in zip(batch, vectors, strict=True):
            rows[i] = v
        done = sum(effective[i] for i in batch)
        timing.tokens += done
        bar.update(done)

    batch: list[int] = []
    for i in order:
        padded = (len(batch) + 1) * effective[i]  # sorted: the newest item is the longest
        # Bounded padding: mixing 256- and 4096-token inputs would compute mostly padding.
        uneven = bool(batch) and effective[i] > MAX_PAD_RATIO * effective[batch[0]]
        if batch and (len(batch) >= backend.batch_items or padded > backend.batch_tokens or uneven):
            flush(batch)
            batch = []
        batch.append(i)
    if batch:
        flush(batch)
    dims = {r.shape[0] for r in rows if r is not None}
    if len(dims) != 1:
        raise ParityError(f"{backend.spec}: vectors of different sizes {sorted(dims)} in one run")
    return np.stack([r for r in rows if r is not None]), timing
