"""`POST /classify` and TEI's `POST /predict` through the gateway: placed whole
(gateway/routes/pipeline.py) on the pools of the longest input, counted as the classifier reads it (a
text alone, a pair with the tokenizer's pair template); the pool's answer comes back as it is."""

from __future__ import annotations

from embedserve.api.classify import ClassifyRequest, PredictRequest
from embedserve.api.routes import CLASSIFY, PREDICT
from embedserve.gateway.routes.jobs import WholeJob
from embedserve.gateway.routes.pipeline import GatewayRoute, Pipeline


class ClassifyJob(WholeJob[ClassifyRequest | PredictRequest]):
    """vLLM's body or TEI's: the same texts and pairs, the same over-long policy."""

    def __init__(self, gw: Pipeline, req: ClassifyRequest | PredictRequest) -> None:
        super().__init__(req, req.model, len(req.items), req.policy)
        self.counter = gw.counter

    @property
    def truncate_remedy(self) -> str:
        return self.req.truncate_remedy  # vLLM's body or TEI's

    def count(self) -> list[int]:
        return self.counter.count_classify(self.req.items)


CLASSIFY_ROUTE = GatewayRoute(CLASSIFY, ClassifyJob)
PREDICT_ROUTE = GatewayRoute(PREDICT, ClassifyJob)
