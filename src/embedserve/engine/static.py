"""Inference-free SPLADE's queries on the engine (models/router.py): rendered without special
tokens (tokenizer/render.py's `static`), answered at once from the static weights, no request
queued, no step run. `Engine.prepare` renders a query so when the ask names the model's `query`
prompt (`prompt_name`, Cohere's `input_type: search_query`)."""

from __future__ import annotations

import itertools
import time
from concurrent.futures import Future

from embedserve.config import EngineConfig
from embedserve.engine.core import Finished
from embedserve.errors import InvalidInputError
from embedserve.models.sparse_head import SparseHead
from embedserve.models.static_queries import StaticQueries
from embedserve.pooling.head import apply_head
from embedserve.request import EmbedParams, Request, RequestStatus
from embedserve.tokenizer import Tokenized, Tokenizer


class StaticQueryMixin:
    config: EngineConfig
    tokenizer: Tokenizer
    sparse_head: SparseHead | None
    static_queries: StaticQueries | None
    _ids: itertools.count[int]

    def _static_results(self, tokenized: list[Tokenized], normalize: bool | None) -> list[Future[Finished]]:
        """Each query's vector (L2-normalized if asked; None: the model's default), already
        answered: no engine step."""
        static = self.static_queries
        assert static is not None
        if not all(t.static for t in tokenized):
            raise InvalidInputError("inference-free queries and documents go in separate requests")
        pool = self.config.pooling
        params = EmbedParams(normalize=pool.normalize if normalize is None else normalize)
        out: list[Future[Finished]] = []
        for t in tokenized:
            req = Request(next(self._ids), t.token_ids, params, pool.method, sparse_head=self.sparse_head)
            req.status, req.first_scheduled_time = RequestStatus.FINISHED, req.arrival_time
            vector = apply_head(static.vector(t.token_ids), None, params.normalize)
            future: Future[Finished] = Future()
            future.set_result(Finished(req, vector, None, time.monotonic()))
            out.append(future)
        return out
