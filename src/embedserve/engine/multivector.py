"""Multi-vector embeddings on the engine: an input runs as one ordinary request (same batching,
token budget, chunked prefill, preemption, layer-major lane), pooled token-wise through the
model's token head (models/multivector.py, pooling/multivector.py): one vector per kept token.

`MultiVectorMixin` gives `Engine` its multi-vector methods; `maxsim` scores a query's vectors
against a document's.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from embedserve.engine.base import EngineBase
from embedserve.engine.core import Finished
from embedserve.engine.loop import wait_all
from embedserve.engine.outputs import EmbeddingOutput, gather_outputs, output_of
from embedserve.errors import InvalidInputError
from embedserve.pooling.multivector import MultiVectorState
from embedserve.tokenizer import Tokenized

if TYPE_CHECKING:
    from embedserve.models.multivector import MultiVectorHead

SIDES = ("query", "document")


@dataclass(frozen=True)
class MultiVectorInput:
    """One input as the model reads it on its side: tokens (a query's expansion included),
    which positions give a vector, and how many positions are keys (None: all)."""

    tokenized: Tokenized
    side: str
    keep: list[bool]
    attend_keys: int | None

    @property
    def num_vectors(self) -> int:
        return sum(self.keep)


def maxsim(query: np.ndarray, document: np.ndarray) -> float:
    """ColBERT's late-interaction score: each query vector's best dot product with a document
    vector, summed (float64)."""
    return float((query.astype(np.float64) @ document.astype(np.float64).T).max(axis=1).sum())


class MultiVectorMixin(EngineBase):
    @property
    def multivector_head(self) -> MultiVectorHead | None:
        """The token head of a multi-vector model (ColBERT, BGE-M3's colbert_linear); None otherwise."""
        return self._loop.parts.multivector_head

    def _mv_head(self) -> MultiVectorHead:
        head = self.multivector_head
        if head is None:
            raise InvalidInputError(
                f"model {self.name} gives one vector per input: it has no multi-vector head "
                "(a ColBERT Dense module or BGE-M3's colbert_linear.pt)"
            )
        return head

    def tokenize_multivector(
        self,
        inputs: str | Sequence[Any],
        side: str = "document",
        *,
        prompt_name: str | None = None,
        prompt: str | None = None,
        truncate: str = "error",
    ) -> list[MultiVectorInput]:
        """Each input as the model reads it on `side` ("query" or "document"): the side's prompt
        (unless one is named), its length limit (a query's expansion length, a document's
        document_length), a query padded with the expansion token, the skiplist applied."""
        head = self._mv_head()
        if side not in SIDES:
            raise InvalidInputError(f"input_type must be 'query' or 'document', got {side!r}")
        first = inputs[0] if not isinstance(inputs, str) and len(inputs) else None
        as_ids = isinstance(first, (list, tuple)) and all(isinstance(x, int) for x in first)
        prompts = {} if as_ids else self.config.prompts  # token-id inputs take no side prompt
        text_prompt = self.resolve_prompt(head.side_prompt(side, prompt_name, prompt, prompts), prompt)
        max_len = head.side_limit(side, self.config.scheduler.max_model_len)
        expansion = head.expansion if side == "query" else None
        out: list[MultiVectorInput] = []
        for tok in self.tokenize(inputs, text_prompt, truncate, max_len):
            ids, keys = tok.token_ids, None
            if expansion is not None and len(ids) < expansion.length and tok.multimodal is not None:
                raise InvalidInputError(
                    f"input {len(out)}: query expansion pads text queries, not image ones"
                )
            if expansion is not None and len(ids) < expansion.length:
                keys = None if expansion.attend else len(ids)
                ids = ids + [expansion.token_id] * (head.read_length(side, len(ids)) - len(ids))
                tok = replace(tok, token_ids=ids)
            if keys is not None and (self.config.model.is_causal or self.config.model.causal_mask):
                raise InvalidInputError(
                    f"model {self.name}: query expansion without attention needs an encoder"
                )
            keep = head.keeps(ids, side)
            if not any(keep):
                raise InvalidInputError(
                    f"input {len(out)}: no token of it gives a vector ({len(ids)} tokens)"
                )
            out.append(MultiVectorInput(tok, side, keep, keys))
        return out

    def check_vector_dimensions(self, dimensions: int | None) -> None:
        dim = self._mv_head().dim
        if dimensions is not None and (
            isinstance(dimensions, bool) or not isinstance(dimensions, int) or not 1 <= dimensions <= dim
        ):
            raise InvalidInputError(f"dimensions must be an integer in [1, {dim}], got {dimensions!r}")

    def submit_multivector(
        self,
        items: list[MultiVectorInput],
        *,
        dimensions: int | None = None,
        normalize: bool | None = None,
        priority: str = "online",
    ) -> list[Future[Finished]]:
        """Queue tokenized inputs; each answers [vectors, dim] float32 (sliced to `dimensions`,
        each vector normalized as the model says unless `normalize`)."""
        head = self._mv_head()
        self.check_vector_dimensions(dimensions)
        # sliced vectors are normalized, as sentence-transformers' truncate_dim does, unless asked not to
        norm = (head.normalize or dimensions is not None) if normalize is None else normalize
        chunk = self.config.scheduler.deterministic_chunk
        states = [MultiVectorState(head, item.keep, chunk, dimensions, norm) for item in items]
        tokenized, attend = [i.tokenized for i in items], [i.attend_keys for i in items]
        return self._loop.submit(self._requests(tokenized, None, False, priority, states, attend))

    def embed_multivector(
        self,
        inputs: str | Sequence[Any],
        *,
        input_type: str = "document",
        prompt_name: str | None = None,
        prompt: str | None = None,
        dimensions: int | None = None,
        normalize: bool | None = None,
        priority: str = "online",
        truncate: str = "error",
    ) -> list[np.ndarray]:
        """Each input's vectors, [vectors, dim] float32, as `input_type` ("query" | "document")."""
        items = self.tokenize_multivector(
            inputs, input_type, prompt_name=prompt_name, prompt=prompt, truncate=truncate
        )
        futures = self.submit_multivector(
            items, dimensions=dimensions, normalize=normalize, priority=priority
        )
        return [output_of(f, i.tokenized).embedding for f, i in zip(wait_all(futures), items, strict=True)]

    async def embed_multivector_tokenized_async(
        self,
        items: list[MultiVectorInput],
        *,
        dimensions: int | None = None,
        normalize: bool | None = None,
        priority: str = "online",
    ) -> list[EmbeddingOutput]:
        """`submit_multivector`, awaited: each output's embedding is [vectors, dim]."""
        futures = self.submit_multivector(
            items, dimensions=dimensions, normalize=normalize, priority=priority
        )
        return await gather_outputs(futures, [i.tokenized for i in items])
