"""Multi-vector embeddings on the engine: an input runs as one ordinary request (same batching,
token budget, chunked prefill, preemption, layer-major lane), pooled token-wise through the
model's token head (models/multivector.py, pooling/multivector.py): one vector per kept token.
The renderer makes each input's side (tokenizer/render_sides.py); `maxsim` scores a query's vectors
against a document's.
"""

from __future__ import annotations

from concurrent.futures import Future

import numpy as np

from embedserve.engine.ask import MultiVectorInput
from embedserve.engine.base import EngineBase
from embedserve.engine.core import Finished
from embedserve.pooling.multivector import MultiVectorState


def maxsim(query: np.ndarray, document: np.ndarray) -> float:
    """ColBERT's late-interaction score: each query vector's best dot product with a document
    vector, summed (float64)."""
    return float((query.astype(np.float64) @ document.astype(np.float64).T).max(axis=1).sum())


class MultiVectorMixin(EngineBase):
    def _submit_multivector(
        self, items: list[MultiVectorInput], dimensions: int | None, normalize: bool | None, priority: str
    ) -> list[Future[Finished]]:
        """Queue rendered inputs; each answers [vectors, dim] float32 (sliced to `dimensions`,
        each vector normalized as the model says unless `normalize`)."""
        self.renderer.check_vector_dimensions(dimensions)
        head = self.multivector_head
        assert head is not None
        # sliced vectors are normalized, as sentence-transformers' truncate_dim does, unless asked not to
        norm = (head.normalize or dimensions is not None) if normalize is None else normalize
        chunk = self.config.scheduler.deterministic_chunk
        states = [MultiVectorState(head, item.keep, chunk, dimensions, norm) for item in items]
        tokenized, attend = [i.tokenized for i in items], [i.attend_keys for i in items]
        return self._loop.submit(self._requests(tokenized, None, False, priority, states, attend))
