"""BGE-M3's sparse vectors on the engine: the same requests as its dense ones (batching, token
budget, chunked prefill, preemption), pooled through its lexical head (models/lexical_head.py)
instead of its CLS row. `LexicalMixin` gives `Engine` the methods; a BGE-M3 model answers dense
requests as any encoder."""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

import numpy as np
import torch

from embedserve.config import PoolingMethod
from embedserve.engine.core import Finished
from embedserve.engine.loop import EngineLoop, gather_all, wait_all
from embedserve.engine.outputs import EmbeddingOutput, output_of
from embedserve.engine.rerank import HeadMixin
from embedserve.errors import InternalEngineError, InvalidInputError
from embedserve.models.lexical_head import LexicalHead
from embedserve.pooling.head import apply_head
from embedserve.pooling.state import PoolingState
from embedserve.request import Request
from embedserve.tokenizer import Tokenized


class DenseAndLexical(PoolingState):
    """One pass, both of BGE-M3's vectors: the lexical fold over every row, and the CLS row kept
    (position 0) for the dense vector; `finish` returns [CLS row | lexical weights]."""

    def reset(self) -> None:
        super().reset()
        self._cls: torch.Tensor | None = None

    def update(self, start: int, n: int, rows: torch.Tensor) -> None:
        if start == 0 and rows.shape[0]:
            self._cls = rows[0].float().clone()
        super().update(start, n, rows)

    def finish(self) -> torch.Tensor:
        lexical = super().finish()
        if self._cls is None:
            raise InternalEngineError("the CLS row was never pooled")
        return torch.cat([self._cls, lexical])


class LexicalMixin(HeadMixin):
    lexical_head: LexicalHead | None
    name: str
    _loop: EngineLoop

    def _requests(
        self, tokenized: list[Tokenized], dimensions: int | None, normalize: bool | None, priority: str
    ) -> list[Request]:
        raise NotImplementedError  # Engine's

    def resolve_prompt(self, prompt_name: str | None, prompt: str | None) -> str:
        raise NotImplementedError  # Engine's

    def check_dimensions(self, dimensions: int | None) -> None:
        raise NotImplementedError  # Engine's

    def tokenize(
        self, inputs: Any, prompt: str = "", truncate: str = "error", max_len: int | None = None
    ) -> list[Tokenized]:
        raise NotImplementedError  # Engine's

    def submit_lexical(
        self, tokenized: list[Tokenized], priority: str = "online", normalize: bool | None = None
    ) -> list[Future[Finished]]:
        """Queue tokenized inputs for their lexical weights ([vocab] vectors; L2-normalized only
        when asked: FlagEmbedding's are not)."""
        head = self.lexical_head
        if head is None:
            raise InvalidInputError(
                f"model {self.name} has no lexical head (BGE-M3's sparse_linear.pt): its vectors are dense"
            )
        return self._loop.submit(
            self._lexical_requests(tokenized, head, bool(normalize), priority, PoolingState)
        )

    def _lexical_requests(
        self,
        tokenized: list[Tokenized],
        head: LexicalHead,
        normalize: bool,
        priority: str,
        state: type[PoolingState],
    ) -> list[Request]:
        requests = self._requests(tokenized, None, normalize, priority)
        chunk = self.config.scheduler.deterministic_chunk
        for req in requests:  # every row folds through the head, keyed by its token id
            ids = req.token_ids
            req.pooling = state(PoolingMethod.SPLADE, len(ids), 0, chunk, head, ids)
        return requests

    async def embed_dense_and_lexical_async(
        self,
        tokenized: list[Tokenized],
        *,
        dimensions: int | None = None,
        normalize: bool | None = None,
        priority: str = "online",
    ) -> tuple[np.ndarray, np.ndarray, list[EmbeddingOutput]]:
        """BGE-M3's dense vectors (its CLS rows, sliced to `dimensions`, normalized as its pooling
        says unless `normalize`) and its lexical weights (unnormalized) from one pass; the
        outputs carry the timings."""
        head = self.lexical_head
        if head is None or self.config.pooling.method is not PoolingMethod.CLS:
            raise InvalidInputError(
                f"model {self.name} does not give dense and lexical vectors from one pass"
            )
        self.check_dimensions(dimensions)
        requests = self._lexical_requests(tokenized, head, False, priority, DenseAndLexical)
        done = await gather_all(self._loop.submit(requests))
        outputs = [output_of(f, t) for f, t in zip(done, tokenized, strict=True)]
        hidden = self.config.model.hidden_size
        norm = self.config.pooling.normalize if normalize is None else normalize
        dense = [
            apply_head(torch.from_numpy(o.embedding[:hidden].copy()), dimensions, norm).numpy()
            for o in outputs
        ]
        return np.stack(dense), np.stack([o.embedding[hidden:] for o in outputs]), outputs

    async def embed_lexical_tokenized_async(
        self, tokenized: list[Tokenized], *, priority: str = "online", normalize: bool | None = None
    ) -> list[EmbeddingOutput]:
        futures = self.submit_lexical(tokenized, priority, normalize)
        return [output_of(f, t) for f, t in zip(await gather_all(futures), tokenized, strict=True)]

    def embed_lexical(
        self,
        inputs: str | Sequence[str],
        *,
        prompt_name: str | None = None,
        prompt: str | None = None,
        priority: str = "online",
        truncate: str = "error",
    ) -> np.ndarray:
        """BGE-M3's lexical weights per input: float32 [n, vocab], the largest weight per token id
        (special tokens left out); options as `Engine.submit`."""
        tokenized = self.tokenize(inputs, self.resolve_prompt(prompt_name, prompt), truncate)
        futures = self.submit_lexical(tokenized, priority)
        return np.stack(
            [output_of(f, t).embedding for f, t in zip(wait_all(futures), tokenized, strict=True)]
        )
