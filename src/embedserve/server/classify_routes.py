"""`POST /classify` (vLLM's shape) and `POST /predict` (TEI's) on the serving template: each
text or (text, text_pair) pair runs as one engine request, its pooled row through the model's
classifier head (engine/classify.py): the probabilities, the best label (api/classify.py)."""

from __future__ import annotations

from typing import Any

import torch

from embedserve.api.classify import ClassifyRequest, PredictRequest, classify_body, predict_body
from embedserve.api.routes import CLASSIFY, PREDICT
from embedserve.engine.classify import labelled
from embedserve.engine.loop import gather_all
from embedserve.engine.outputs import EmbeddingOutput, output_of
from embedserve.server.pipeline import Computed, Job, ServerRoute
from embedserve.server.serving import EmbeddingService
from embedserve.tokenizer import Tokenized


class ClassifyJob(Job):
    def __init__(self, svc: EmbeddingService, req: ClassifyRequest | PredictRequest) -> None:
        super().__init__(req.model, len(req.items))
        self.svc = svc
        self.req = req

    @property
    def truncate_remedy(self) -> str:
        return self.req.truncate_remedy  # vLLM's body or TEI's

    def tokenize(self) -> list[Tokenized]:
        return self.svc.engine.tokenize_classify(self.req.items, self.req.policy)

    async def run(self, tokenized: list[Tokenized]) -> list[EmbeddingOutput]:
        engine = self.svc.engine
        priority = getattr(self.req, "priority", "online")
        done = await gather_all(engine.submit_tokenized(tokenized, normalize=False, priority=priority))
        return [output_of(f, t) for f, t in zip(done, tokenized, strict=True)]

    def labelled(self, done: Computed) -> list[tuple[str, list[float]]]:
        rows = torch.from_numpy(done.matrix())
        return labelled(self.svc.engine.classifier(), rows, self.req.raw_scores)

    def body(self, done: Computed) -> Any:
        return classify_body(self.labelled(done), done.n_tokens, self.svc.metadata.fields())


class PredictJob(ClassifyJob):
    def __init__(self, svc: EmbeddingService, req: PredictRequest) -> None:
        super().__init__(svc, req)
        self.predict = req

    def body(self, done: Computed) -> Any:
        probs = [p for _, p in self.labelled(done)]
        return predict_body(self.predict, self.svc.engine.classifier().labels, probs)


CLASSIFY_ROUTE = ServerRoute(CLASSIFY, ClassifyJob)
PREDICT_ROUTE = ServerRoute(PREDICT, PredictJob)
