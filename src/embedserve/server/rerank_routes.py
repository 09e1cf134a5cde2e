"""`POST /v1/rerank` (also `/rerank`, `/v2/rerank`) on the serving template: (query, document)
pairs tokenized as the reranker reads them, scored, ranked best first (api/rerank.py's body, or
TEI's list for TEI's request body: api/tei.py)."""

from __future__ import annotations

from typing import Any

import torch

from embedserve.api.protocol import ApiError
from embedserve.api.rerank import RerankRequest, rerank_body
from embedserve.api.routes import RERANK
from embedserve.api.tei import tei_rerank_body
from embedserve.engine.multivector import MultiVectorInput, maxsim
from embedserve.engine.outputs import EmbeddingOutput, output_of
from embedserve.engine.rerank import ranked
from embedserve.pooling.outputs import Output
from embedserve.server.pipeline import Computed, Job, ServerRoute
from embedserve.server.serving import EmbeddingService
from embedserve.tokenizer import Tokenized


class RerankJob(Job):
    def __init__(self, svc: EmbeddingService, req: RerankRequest) -> None:
        super().__init__(req.model, len(req.documents))
        self.svc = svc
        self.req = req

    @property
    def truncate_remedy(self) -> str:
        return self.req.truncate_remedy  # TEI's body or ours

    def tokenize(self) -> list[Tokenized]:
        req = self.req
        return self.svc.engine.tokenize_pairs(req.query, req.texts, req.truncate, req.instruction)

    async def run(self, tokenized: list[Tokenized]) -> list[EmbeddingOutput]:
        done = await self.svc.engine.rerank_tokenized_async(tokenized, priority=self.req.priority)
        return [output_of(f, t) for f, t in zip(done, tokenized, strict=True)]

    def body(self, done: Computed) -> Any:
        req, engine = self.req, self.svc.engine
        rows = torch.from_numpy(done.matrix())
        results = ranked(engine.scores(rows, req.raw_scores), done.tokenized, req.top_n)
        scored = [(r.index, r.relevance_score) for r in results]
        body = rerank_body(req, scored, done.n_tokens, self.svc.metadata.fields())
        return tei_rerank_body(req, body) if req.tei else body


class MaxSimRerankJob(Job):
    """A multi-vector model reranks by MaxSim: the query's vectors (query side) against each
    document's (document side), one engine call for all; scores are unnormalized sums."""

    def __init__(self, svc: EmbeddingService, req: RerankRequest) -> None:
        super().__init__(req.model, len(req.documents))
        self.svc = svc
        self.req = req
        self.items: list[MultiVectorInput] = []

    @property
    def truncate_remedy(self) -> str:
        return self.req.truncate_remedy

    def serves(self, task: str) -> bool:
        return task == "embed"

    def tokenize(self) -> list[Tokenized]:
        req, engine = self.req, self.svc.engine
        if req.instruction is not None or req.raw_scores:
            raise ApiError(400, "instruction and raw_scores apply to reranker models, not to MaxSim scores")
        query = engine.tokenize_multivector([req.query], "query", truncate=req.truncate)
        documents = engine.tokenize_multivector(req.texts, "document", truncate=req.truncate)
        self.items = query + documents
        return [i.tokenized for i in self.items]

    async def run(self, tokenized: list[Tokenized]) -> list[EmbeddingOutput]:
        return await self.svc.engine.embed_multivector_tokenized_async(self.items, priority=self.req.priority)

    def body(self, done: Computed) -> Any:
        req = self.req
        query, *documents = [o.embedding for o in done.outputs]
        results = ranked([maxsim(query, d) for d in documents], done.tokenized[1:], req.top_n)
        scored = [(r.index, r.relevance_score) for r in results]
        body = rerank_body(req, scored, done.n_tokens, self.svc.metadata.fields())
        return tei_rerank_body(req, body) if req.tei else body


def rerank_job(svc: EmbeddingService, req: RerankRequest) -> Job:
    """A reranker's scores, or a multi-vector embedding model's MaxSim."""
    return MaxSimRerankJob(svc, req) if Output.MULTIVECTOR in svc.engine.outputs else RerankJob(svc, req)


RERANK_ROUTE = ServerRoute(RERANK, rerank_job)
