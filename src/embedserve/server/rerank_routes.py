"""`POST /v1/rerank` (also `/rerank`, `/v2/rerank`) on the serving template: (query, document)
pairs tokenized as the reranker reads them, scored, ranked best first (api/rerank.py's body, or
TEI's list for TEI's request body: api/tei.py)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from embedserve.api.protocol import ApiError
from embedserve.api.rerank import RerankRequest, rerank_body
from embedserve.api.routes import RERANK
from embedserve.api.tei import tei_rerank_body
from embedserve.engine.ask import Ask, Prepared, answers_as
from embedserve.engine.multivector import maxsim
from embedserve.engine.outputs import EmbeddingOutput
from embedserve.engine.rerank import RerankResult, ranked
from embedserve.pooling.outputs import Output
from embedserve.server.pipeline import Computed, Job, ServerRoute
from embedserve.server.serving import EmbeddingService
from embedserve.tokenizer import Tokenized


class RerankJob(Job):
    def __init__(self, svc: EmbeddingService, req: RerankRequest) -> None:
        super().__init__(req.model, len(req.documents))
        self.svc = svc
        self.req = req
        self.results: list[RerankResult] = []

    @property
    def truncate_remedy(self) -> str:
        return self.req.truncate_remedy  # TEI's body or ours

    def tokenize(self) -> list[Tokenized]:
        req = self.req
        ask = Ask(Output.SCORES, truncate=req.truncate, priority=req.priority, raw_scores=req.raw_scores)
        ask = replace(ask, instruction=req.instruction)
        self.prepared = self.svc.engine.prepare((req.query, req.texts), ask)
        return self.prepared.tokenized

    async def run(self, tokenized: list[Tokenized]) -> list[EmbeddingOutput]:
        self.results = answers_as(await self.svc.engine.run_async(self.prepared), RerankResult)
        return [r.output for r in self.results if r.output is not None]

    def body(self, done: Computed) -> Any:
        req = self.req
        scored = [(r.index, r.relevance_score) for r in ranked(self.results, req.top_n)]
        body = rerank_body(req, scored, done.n_tokens, self.svc.metadata.fields())
        return tei_rerank_body(req, body) if req.tei else body


class MaxSimRerankJob(Job):
    """A multi-vector model reranks by MaxSim: the query's vectors (query side) against each
    document's (document side), one engine call for all; scores are unnormalized sums."""

    def __init__(self, svc: EmbeddingService, req: RerankRequest) -> None:
        super().__init__(req.model, len(req.documents))
        self.svc = svc
        self.req = req

    @property
    def truncate_remedy(self) -> str:
        return self.req.truncate_remedy

    def serves(self, task: str) -> bool:
        return task == "embed"

    def tokenize(self) -> list[Tokenized]:
        req, engine = self.req, self.svc.engine
        if req.instruction is not None or req.raw_scores:
            raise ApiError(400, "instruction and raw_scores apply to reranker models, not to MaxSim scores")
        ask = Ask(Output.MULTIVECTOR, truncate=req.truncate, priority=req.priority)
        query = engine.prepare([req.query], replace(ask, side="query")).sides or []
        documents = engine.prepare(req.texts, ask).sides or []
        self.prepared = Prepared(ask, [i.tokenized for i in query + documents], sides=query + documents)
        return self.prepared.tokenized

    async def run(self, tokenized: list[Tokenized]) -> list[EmbeddingOutput]:
        return answers_as(await self.svc.engine.run_async(self.prepared), EmbeddingOutput)

    def body(self, done: Computed) -> Any:
        req = self.req
        query, *documents = [o.embedding for o in done.outputs]
        results = [
            RerankResult(i, maxsim(query, d), len(t.token_ids), t.truncated)
            for i, (d, t) in enumerate(zip(documents, done.tokenized[1:], strict=True))
        ]
        scored = [(r.index, r.relevance_score) for r in ranked(results, req.top_n)]
        body = rerank_body(req, scored, done.n_tokens, self.svc.metadata.fields())
        return tei_rerank_body(req, body) if req.tei else body


def rerank_job(svc: EmbeddingService, req: RerankRequest) -> Job:
    """A reranker's scores, or a multi-vector embedding model's MaxSim."""
    return MaxSimRerankJob(svc, req) if Output.MULTIVECTOR in svc.engine.outputs else RerankJob(svc, req)


RERANK_ROUTE = ServerRoute(RERANK, rerank_job)
