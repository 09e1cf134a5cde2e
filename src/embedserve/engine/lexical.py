"""BGE-M3's sparse vectors on the engine: the same requests as its dense ones (batching, token
budget, chunked prefill, preemption), pooled through its lexical head (models/lexical_head.py)
instead of its CLS row. `LexicalMixin` gives `Engine` the methods; a BGE-M3 model answers dense
requests as any encoder."""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass

import numpy as np
import torch

from embedserve.config import PoolingMethod
from embedserve.engine.ask import Ask
from embedserve.engine.core import Finished
from embedserve.engine.multivector import MultiVectorMixin
from embedserve.engine.outputs import EmbeddingOutput
from embedserve.errors import InternalEngineError, InvalidInputError
from embedserve.models.lexical_head import LexicalHead
from embedserve.models.multivector import MultiVectorHead
from embedserve.pooling.head import apply_head
from embedserve.pooling.multivector import MultiVectorState
from embedserve.pooling.outputs import Output
from embedserve.pooling.state import PoolingState
from embedserve.request import Request
from embedserve.tokenizer import Tokenized


class DenseAndLexical(PoolingState):
    """One pass, all of BGE-M3's vectors: the lexical fold over every row, the CLS row kept
    (position 0) for the dense vector, and with `multivector` its token vectors (positions 1..);
    `finish` returns [CLS row | lexical weights | the token vectors, flattened]."""

    multivector: MultiVectorState | None = None

    def reset(self) -> None:
        super().reset()
        self._cls: torch.Tensor | None = None
        if self.multivector is not None:
            self.multivector.reset()

    def update(self, start: int, n: int, rows: torch.Tensor) -> None:
        if start == 0 and rows.shape[0]:
            self._cls = rows[0].float().clone()
        if self.multivector is not None:  # every row of the chunk is here (the lexical fold's)
            lo, hi = self.multivector.rows(start, n)
            self.multivector.update(start, n, rows[lo:hi])
        super().update(start, n, rows)

    def finish(self) -> torch.Tensor:
        lexical = super().finish()
        if self._cls is None:
            raise InternalEngineError("the CLS row was never pooled")
        tokens = [] if self.multivector is None else [self.multivector.finish().flatten()]
        return torch.cat([self._cls, lexical, *tokens])


@dataclass(frozen=True)
class OnePassOutput:
    """BGE-M3's vectors of one input from one pass."""

    dense: np.ndarray  # [dimensions]
    lexical: np.ndarray  # [vocab] lexical weights (unnormalized)
    multivector: np.ndarray | None  # [vectors, dim], when asked
    output: EmbeddingOutput  # timings, token counts (its embedding: the pass's flat row)


class LexicalMixin(MultiVectorMixin):
    """BGE-M3's lexical weights (what Engine it takes: MultiVectorMixin's; its one pass includes
    the token vectors)."""

    def _submit_lexical(
        self, tokenized: list[Tokenized], priority: str = "online", normalize: bool | None = None
    ) -> list[Future[Finished]]:
        """Queue rendered inputs for their lexical weights ([vocab] vectors; L2-normalized only
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
        tokens: MultiVectorHead | None = None,
        dimensions: int | None = None,
    ) -> list[Request]:
        """Every row folds through the lexical head, keyed by its token id; with `tokens`
        (a DenseAndLexical `state`) the document side's token vectors too."""
        chunk = self.config.scheduler.deterministic_chunk
        states = []
        for t in tokenized:
            ids = t.token_ids
            states.append(state(PoolingMethod.SPLADE, len(ids), 0, chunk, head, ids))
            if tokens is not None:
                assert isinstance(states[-1], DenseAndLexical)
                keep = tokens.keeps(ids, "document")
                states[-1].multivector = MultiVectorState(tokens, keep, chunk, dimensions, tokens.normalize)
        return self._requests(tokenized, None, normalize, priority, states)

    def _submit_one_pass(self, tokenized: list[Tokenized], ask: Ask) -> list[Future[Finished]]:
        """BGE-M3's dense vectors, lexical weights and (`ask.extras` MULTIVECTOR) its token
        vectors, queued as one request per input."""
        head = self.lexical_head
        multivector = Output.MULTIVECTOR in ask.extras
        tokens = self.multivector_head if multivector else None
        if (
            head is None
            or self.config.pooling.method is not PoolingMethod.CLS
            or (multivector and tokens is None)
        ):
            raise InvalidInputError(f"model {self.name} does not give BGE-M3's vectors from one pass")
        self._check_dimensions(ask.dimensions)
        if tokens is not None:
            self.renderer.check_vector_dimensions(ask.dimensions)
        requests = self._lexical_requests(
            tokenized, head, False, ask.priority, DenseAndLexical, tokens, ask.dimensions
        )
        return self._loop.submit(requests)

    def _one_pass(self, outputs: list[EmbeddingOutput], ask: Ask) -> list[OnePassOutput]:
        """Each pass's row cut into its parts: the CLS row (sliced to `dimensions`, normalized as
        the pooling says unless `normalize`), the lexical weights, the token vectors."""
        hidden, vocab = self.config.model.hidden_size, self.config.model.vocab_size
        norm = self.config.pooling.normalize if ask.normalize is None else ask.normalize
        tokens = self.multivector_head if Output.MULTIVECTOR in ask.extras else None
        width = ask.dimensions or (0 if tokens is None else tokens.dim)
        out = []
        for o in outputs:
            row = o.embedding
            dense = apply_head(torch.from_numpy(row[:hidden].copy()), ask.dimensions, norm).numpy()
            multi = None if tokens is None else row[hidden + vocab :].reshape(-1, width)
            out.append(OnePassOutput(dense, row[hidden : hidden + vocab], multi, o))
        return out
