"""Inference-free SPLADE's queries on the engine (models/router.py): tokenized without special
tokens, answered at once from the static weights, no request queued, no step run.
`StaticQueryMixin` gives `Engine` the route; engine.py sends a query there when the request asks
for the model's `query` prompt (`prompt_name`, Cohere's `input_type: search_query`)."""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

from embedserve.config import EngineConfig
from embedserve.engine.core import Finished
from embedserve.errors import InputTooLongError, InvalidInputError
from embedserve.models.router import QUERY_PROMPT_NAME
from embedserve.models.sparse_head import SparseHead
from embedserve.models.static_queries import StaticQueries
from embedserve.pooling.head import apply_head
from embedserve.request import EmbedParams, Request, RequestStatus
from embedserve.tokenizer import Tokenized, Tokenizer, Truncate


class StaticQueryMixin:
    config: EngineConfig
    tokenizer: Tokenizer
    sparse_head: SparseHead | None
    static_queries: StaticQueries | None
    _ids: itertools.count[int]

    def routes_statically(self, prompt_name: str | None) -> bool:
        """Whether inputs with this prompt name skip the model (an inference-free model's queries)."""
        return self.static_queries is not None and prompt_name == QUERY_PROMPT_NAME

    def tokenize_static(
        self, inputs: str | Sequence[Any], prompt: str = "", truncate: str = "error"
    ) -> list[Tokenized]:
        """Queries as the static module reads them: the prompt before each, no special tokens;
        over its max length refused or cut as `truncate` says."""
        static = self.static_queries
        assert static is not None
        policy = Truncate.parse(truncate)
        items: Sequence[Any] = [inputs] if isinstance(inputs, str) else inputs
        if len(items) == 0:
            raise InvalidInputError("inputs is empty: pass at least one string")
        out = []
        for i, text in enumerate(items):
            try:
                ids = static.ids(text, prompt, self.tokenizer.backend)
            except InvalidInputError as e:
                raise InvalidInputError(f"input {i}: {e}") from None
            n = static.max_length
            if len(ids) > n and policy is Truncate.ERROR:
                raise InputTooLongError(len(ids), n, index=i)
            cut = ids[:n] if policy is Truncate.END else ids[-n:]
            out.append(Tokenized(token_ids=cut, truncated=len(cut) < len(ids), static=True))
        return out

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
