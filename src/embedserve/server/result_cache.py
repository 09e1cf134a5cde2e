"""Repeated inputs answered from memory (`--result-cache-entries N`, off by default): an LRU of
embedding vectors keyed by everything that decides the vector.

    key     sha256 of (embedding_schema, prompt positions, token ids)
            embedding_schema already holds the model, its version, dtype, backend profile
            (deterministic or not), pooling, prompt table, dimensions and normalization; the
            token ids hold the prompt and truncation; the prompt positions decide what MEAN
            pooling excludes. Compressed types are made from the float vector per request.
    value   the float32 vector the engine returned (read-only) and its token count

Inputs with images are never cached (their image tokens are the same ids for any image of a
size). Guarantee: under `--deterministic` a hit is byte-identical to a recompute (the engine's
vectors do not depend on what they were batched with); otherwise a hit is the vector computed
the first time, and a recompute may differ from it by batch-dependent rounding (fp32: ~1e-7,
bf16: its rounding), as two recomputes may. Memory: at most N entries of `dim * 4` bytes plus
about 200 bytes each (key, LRU links), e.g. 100,000 entries of 1024 dims: ~430 MB.

The cache lives on the event loop (every access is on it): no lock.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge

from embedserve.engine.outputs import EmbeddingOutput
from embedserve.tokenizer import Tokenized

_ENTRY_OVERHEAD = 200  # bytes per entry beside the vector: key, OrderedDict links, tuple


@dataclass(frozen=True)
class Hit:
    vector: np.ndarray  # float32 [dim], read-only
    num_tokens: int


class ResultCache:
    def __init__(self, max_entries: int, registry: CollectorRegistry) -> None:
        if max_entries < 1:
            raise ValueError("result cache entries must be >= 1")
        self.max_entries = max_entries
        self._entries: OrderedDict[bytes, Hit] = OrderedDict()
        self.hits = Counter(
            "embedserve_result_cache_hits", "Inputs answered from the result cache", registry=registry
        )
        self.misses = Counter(
            "embedserve_result_cache_misses", "Cacheable inputs the engine computed", registry=registry
        )
        self.evictions = Counter(
            "embedserve_result_cache_evictions", "Least recently used entries dropped", registry=registry
        )
        self.size = Gauge("embedserve_result_cache_entries", "Entries in the result cache", registry=registry)
        self.bytes = Gauge(
            "embedserve_result_cache_bytes", "Estimated bytes the cache holds", registry=registry
        )
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    @staticmethod
    def key(schema: str, tok: Tokenized) -> bytes | None:
        """The entry's key, or None for an input that is not cached (images, late chunks, static
        queries: answered without the model anyway)."""
        if tok.multimodal is not None or tok.late is not None or tok.static:
            return None
        h = hashlib.sha256(schema.encode())
        h.update(tok.prompt_tokens.to_bytes(4, "little"))
        h.update(np.asarray(tok.token_ids, dtype=np.int64).tobytes())
        return h.digest()

    def get(self, key: bytes) -> Hit | None:
        hit = self._entries.get(key)
        if hit is None:
            self.misses.inc()
            return None
        self._entries.move_to_end(key)
        self.hits.inc()
        return hit

    def put(self, key: bytes, vector: np.ndarray, num_tokens: int) -> None:
        if key in self._entries:
            self._entries.move_to_end(key)
            return
        stored = np.array(vector, dtype=np.float32, copy=True)
        stored.flags.writeable = False
        self._entries[key] = Hit(stored, num_tokens)
        self._bytes += stored.nbytes + _ENTRY_OVERHEAD
        while len(self._entries) > self.max_entries:
            _, old = self._entries.popitem(last=False)
            self._bytes -= old.vector.nbytes + _ENTRY_OVERHEAD
            self.evictions.inc()
        self.size.set(len(self._entries))
        self.bytes.set(self._bytes)

    async def through(
        self,
        schema: str,
        tokenized: list[Tokenized],
        compute: Callable[[list[Tokenized]], Awaitable[list[EmbeddingOutput]]],
    ) -> list[EmbeddingOutput]:
        """One request's outputs in input order: hits from the cache (no engine work: no queue
        or inference time), the rest from `compute`, then cached."""
        keys = [self.key(schema, t) for t in tokenized]
        hits = [None if k is None else self.get(k) for k in keys]
        todo = [i for i, hit in enumerate(hits) if hit is None]
        computed = await compute([tokenized[i] for i in todo]) if todo else []
        outputs: dict[int, EmbeddingOutput] = dict(zip(todo, computed, strict=True))
        for i, out in outputs.items():
            if (key := keys[i]) is not None:
                self.put(key, out.embedding, out.num_tokens)
        now = time.monotonic()
        for i, hit in enumerate(hits):
            if hit is not None:
                truncated = tokenized[i].truncated
                outputs[i] = EmbeddingOutput(hit.vector, hit.num_tokens, truncated, 0.0, 0.0, finish_time=now)
        return [outputs[i] for i in range(len(tokenized))]
