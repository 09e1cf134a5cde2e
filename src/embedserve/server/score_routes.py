"""`POST /v1/score` (also `/score`) on the serving template. An embedding model embeds text_1 and
text_2 exactly as `/v1/embeddings` does with the same options (prompt, truncation) and scores
each pair by the cosine of its vectors; a reranker scores each (text_1, text_2) pair as
`/v1/rerank` does (api/score.py)."""

from __future__ import annotations

from typing import Any

import torch

from embedserve.api.protocol import ApiError
from embedserve.api.routes import SCORE
from embedserve.api.score import ScoreRequest, cosines, score_body
from embedserve.engine.outputs import EmbeddingOutput, output_of
from embedserve.server.pipeline import Computed, Job, ServerRoute
from embedserve.server.serving import EmbeddingService
from embedserve.tokenizer import Tokenized


class ScoreJob(Job):
    def __init__(self, svc: EmbeddingService, req: ScoreRequest) -> None:
        super().__init__(req.model, len(req.left) + len(req.right))
        self.svc = svc
        self.req = req
        self.embeds = svc.engine.config.task == "embed"

    def tokenize(self) -> list[Tokenized]:
        req, engine = self.req, self.svc.engine
        if self.embeds:
            if req.raw_scores or req.instruction is not None:
                raise ApiError(400, "raw_scores and instruction are a reranker's; this model embeds")
            prompt = engine.resolve_prompt(req.prompt_name, req.prompt)
            return engine.tokenize(req.left + req.right, prompt, req.truncate or "error")
        if req.prompt_name is not None or req.prompt is not None:
            raise ApiError(
                400, "prompt_name and prompt are an embedding model's; a reranker takes instruction"
            )
        truncate = req.truncate or "end"
        left, right = req.left, req.right
        if len(left) == 1:  # 1:N: one query against every document
            return engine.tokenize_pairs(left[0], right, truncate, req.instruction)
        pairs = [
            engine.tokenize_pairs(q, [d], truncate, req.instruction) for q, d in zip(left, right, strict=True)
        ]
        return [t for (t,) in pairs]

    async def run(self, tokenized: list[Tokenized]) -> list[EmbeddingOutput]:
        engine, priority = self.svc.engine, self.req.priority
        if self.embeds:
            return await engine.embed_tokenized_async(tokenized, priority=priority)
        done = await engine.rerank_tokenized_async(tokenized, priority=priority)
        return [output_of(f, t) for f, t in zip(done, tokenized, strict=True)]

    def body(self, done: Computed) -> dict[str, Any]:
        req, svc = self.req, self.svc
        rows = done.matrix()
        if self.embeds:
            n_left = len(req.left)
            scores = cosines(rows[:n_left], rows[n_left:], req.pairs)
        else:
            scores = [float(s) for s in svc.engine.scores(torch.from_numpy(rows), req.raw_scores)]
        return score_body(scores, done.n_tokens, svc.metadata.fields())


SCORE_ROUTE = ServerRoute(SCORE, ScoreJob)
