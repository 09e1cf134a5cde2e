"""`POST /classify` (vLLM's shape) and `POST /predict` (TEI's) on the serving template: each
text or (text, text_pair) pair runs as one engine request, its pooled row through the model's
classifier head (engine/classify.py): the probabilities, the best label (api/classify.py)."""

from __future__ import annotations

from typing import Any

from embedserve.api.classify import ClassifyRequest, PredictRequest, classify_body, predict_body
from embedserve.api.routes import CLASSIFY, PREDICT
from embedserve.engine.ask import Ask, answers_as
from embedserve.engine.classify import ClassifyResult
from embedserve.engine.outputs import EmbeddingOutput
from embedserve.pooling.outputs import Output
from embedserve.server.pipeline import Computed, Job, ServerRoute
from embedserve.server.serving import EmbeddingService
from embedserve.tokenizer import Tokenized


class ClassifyJob(Job):
    def __init__(self, svc: EmbeddingService, req: ClassifyRequest | PredictRequest) -> None:
        super().__init__(req.model, len(req.items))
        self.svc = svc
        self.req = req
        self.results: list[ClassifyResult] = []

    @property
    def truncate_remedy(self) -> str:
        return self.req.truncate_remedy  # vLLM's body or TEI's

    def tokenize(self) -> list[Tokenized]:
        req = self.req
        priority = getattr(req, "priority", "online")
        ask = Ask(Output.LABELS, truncate=req.policy, priority=priority, raw_scores=req.raw_scores)
        self.prepared = self.svc.engine.prepare(req.items, ask)
        return self.prepared.tokenized

    async def run(self, tokenized: list[Tokenized]) -> list[EmbeddingOutput]:
        self.results = answers_as(await self.svc.engine.run_async(self.prepared), ClassifyResult)
        return [r.output for r in self.results if r.output is not None]

    def labelled(self, done: Computed) -> list[tuple[str, list[float]]]:
        return [(r.label, r.probs) for r in self.results]

    def body(self, done: Computed) -> Any:
        return classify_body(self.labelled(done), done.n_tokens, self.svc.metadata.fields())


class PredictJob(ClassifyJob):
    def __init__(self, svc: EmbeddingService, req: PredictRequest) -> None:
        super().__init__(svc, req)
        self.predict = req

    def body(self, done: Computed) -> Any:
        probs = [p for _, p in self.labelled(done)]
        head = self.svc.engine.score_head
        assert head is not None, "the renderer refused a model that cannot classify"
        return predict_body(self.predict, head.labels, probs)


CLASSIFY_ROUTE = ServerRoute(CLASSIFY, ClassifyJob)
PREDICT_ROUTE = ServerRoute(PREDICT, PredictJob)
