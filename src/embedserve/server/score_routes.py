"""`POST /v1/score` (also `/score`) on the serving template. An embedding model embeds text_1 and
text_2 exactly as `/v1/embeddings` does with the same options (prompt, truncation) and scores
each pair by the cosine of its vectors; a reranker scores each (text_1, text_2) pair as
`/v1/rerank` does (api/score.py)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from embedserve.api.protocol import ApiError
from embedserve.api.routes import SCORE
from embedserve.api.score import ScoreRequest, cosines, score_body
from embedserve.engine.ask import Ask, Prepared, answers_as
from embedserve.engine.outputs import EmbeddingOutput
from embedserve.engine.rerank import RerankResult
from embedserve.pooling.outputs import Output
from embedserve.server.pipeline import Computed, Job, ServerRoute
from embedserve.server.serving import EmbeddingService
from embedserve.tokenizer import Tokenized


class ScoreJob(Job):
    def __init__(self, svc: EmbeddingService, req: ScoreRequest) -> None:
        super().__init__(req.model, len(req.left) + len(req.right))
        self.svc = svc
        self.req = req
        self.embeds = svc.engine.config.task == "embed"
        self.scores: list[float] = []

    def tokenize(self) -> list[Tokenized]:
        req, engine = self.req, self.svc.engine
        if self.embeds:
            if req.raw_scores or req.instruction is not None:
                raise ApiError(400, "raw_scores and instruction are a reranker's; this model embeds")
            ask = Ask(prompt_name=req.prompt_name, prompt=req.prompt, truncate=req.truncate or "error")
            self.prepared = engine.prepare(req.left + req.right, replace(ask, priority=req.priority))
            return self.prepared.tokenized
        if req.prompt_name is not None or req.prompt is not None:
            raise ApiError(
                400, "prompt_name and prompt are an embedding model's; a reranker takes instruction"
            )
        ask = Ask(Output.SCORES, truncate=req.truncate or "end", priority=req.priority)
        ask = replace(ask, raw_scores=req.raw_scores, instruction=req.instruction)
        left, right = req.left, req.right
        if len(left) == 1:  # 1:N: one query against every document
            self.prepared = engine.prepare((left[0], right), ask)
        else:
            pairs = [engine.prepare((q, [d]), ask).tokenized for q, d in zip(left, right, strict=True)]
            self.prepared = Prepared(ask, [t for (t,) in pairs])
        return self.prepared.tokenized

    async def run(self, tokenized: list[Tokenized]) -> list[EmbeddingOutput]:
        answers = await self.svc.engine.run_async(self.prepared)
        if self.embeds:
            return answers_as(answers, EmbeddingOutput)
        self.scores = [r.relevance_score for r in answers_as(answers, RerankResult)]
        return [r.output for r in answers_as(answers, RerankResult) if r.output is not None]

    def body(self, done: Computed) -> dict[str, Any]:
        req, svc = self.req, self.svc
        if self.embeds:
            rows = done.matrix()
            n_left = len(req.left)
            scores = cosines(rows[:n_left], rows[n_left:], req.pairs)
        else:
            scores = self.scores
        return score_body(scores, done.n_tokens, svc.metadata.fields())


SCORE_ROUTE = ServerRoute(SCORE, ScoreJob)
