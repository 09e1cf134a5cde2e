"""TEI's `POST /embed_all` and vLLM's `POST /pooling` through the gateway: placed whole on the
pools of the longest input (counted as the pool counts it: the prompt and special tokens
included), the pool's answer as it is."""

from __future__ import annotations

from embedserve.api.routes import EMBED_ALL, POOLING
from embedserve.api.token_outputs import EmbedAllRequest, PoolingRequest
from embedserve.errors import TEI_REMEDY
from embedserve.gateway.routes.jobs import TextsJob
from embedserve.gateway.routes.pipeline import GatewayRoute, Pipeline


class EmbedAllJob(TextsJob[EmbedAllRequest]):
    def __init__(self, gw: Pipeline, req: EmbedAllRequest) -> None:
        super().__init__(req, gw.counter, req.items, req.prompt_name, req.policy, TEI_REMEDY)


class PoolingJob(TextsJob[PoolingRequest]):
    def __init__(self, gw: Pipeline, req: PoolingRequest) -> None:
        super().__init__(req, gw.counter, req.items, req.prompt_name, req.truncate)


EMBED_ALL_ROUTE = GatewayRoute(EMBED_ALL, EmbedAllJob)
POOLING_ROUTE = GatewayRoute(POOLING, PoolingJob)
