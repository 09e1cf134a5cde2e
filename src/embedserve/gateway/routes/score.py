"""`POST /v1/score` (also `/score`) through the gateway: placed whole (gateway/routes/pipeline.py), on
the pools of its longest pair. A pair is counted as the pool's model reads it: a reranker's
(text_1, text_2) pair as one sequence, an embedding model's pair by its longer text (each text
is its own sequence there); the pool's answer comes back as it is."""

from __future__ import annotations

from embedserve.api.routes import SCORE
from embedserve.api.score import ScoreRequest
from embedserve.gateway.routes.jobs import WholeJob
from embedserve.gateway.routes.pipeline import GatewayRoute, Pipeline


class ScoreJob(WholeJob[ScoreRequest]):
    def __init__(self, gw: Pipeline, req: ScoreRequest) -> None:
        reranks = gw.counter.spec.score_kind is not None  # a score head reads the pair as one sequence
        super().__init__(req, req.model, len(req.right), req.truncate or ("end" if reranks else "error"))
        self.counter = gw.counter
        self.reranks = reranks

    def count(self) -> list[int]:
        req, counter = self.req, self.counter
        left, right = req.left, req.right
        if self.reranks:
            if len(left) == 1:
                return counter.count_pairs(left[0], right, req.instruction)
            return [counter.count_pairs(q, [d], req.instruction)[0] for q, d in zip(left, right, strict=True)]
        prompt = counter.resolve_prompt(req.prompt_name, req.prompt)
        n1, n2 = counter.count(left, prompt), counter.count(right, prompt)
        return [max(n1[i], n2[j]) for i, j in req.pairs]


SCORE_ROUTE = GatewayRoute(SCORE, ScoreJob)
