"""TEI's `POST /embed_all` and vLLM's `POST /pooling` through the gateway: placed whole on the
pools of the longest input (counted as the pool counts it: the prompt and special tokens
included), the pool's answer as it is."""

from __future__ import annotations

from embedserve.api.routes import EMBED_ALL, POOLING
from embedserve.api.token_outputs import EmbedAllRequest, PoolingRequest
from embedserve.errors import TEI_REMEDY
from embedserve.gateway.jobs import WholeJob
from embedserve.gateway.pipeline import GatewayRoute, Pipeline


class EmbedAllJob(WholeJob[EmbedAllRequest]):
    def __init__(self, gw: Pipeline, req: EmbedAllRequest) -> None:
        super().__init__(req, req.model, len(req.items), req.policy)
        self.counter = gw.counter

    @property
    def truncate_remedy(self) -> str:
        return TEI_REMEDY

    def count(self) -> list[int]:
        return self.counter.count(self.req.items, self.counter.resolve_prompt(self.req.prompt_name, None))


class PoolingJob(WholeJob[PoolingRequest]):
    def __init__(self, gw: Pipeline, req: PoolingRequest) -> None:
        super().__init__(req, req.model, len(req.items), req.truncate)
        self.counter = gw.counter

    def count(self) -> list[int]:
        return self.counter.count(self.req.items, self.counter.resolve_prompt(self.req.prompt_name, None))


EMBED_ALL_ROUTE = GatewayRoute(EMBED_ALL, EmbedAllJob)
POOLING_ROUTE = GatewayRoute(POOLING, PoolingJob)
