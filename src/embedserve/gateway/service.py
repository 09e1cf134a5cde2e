"""The gateway's service: the route template (gateway/routes/pipeline.py) over its pools (HTTP
upstreams, or Ray Serve deployments: scale/ingress.py), with `/v1/embeddings` by name for
in-process callers. The app (gateway/app.py) runs every declared route through `serve`."""

from __future__ import annotations

from embedserve.api.protocol import EmbeddingRequest
from embedserve.gateway.routes.embeddings import EMBEDDINGS_ROUTE
from embedserve.gateway.routes.pipeline import POOLS_HEADER as POOLS_HEADER
from embedserve.gateway.routes.pipeline import Answer, Pipeline
from embedserve.gateway.routes.pipeline import PartRunner as PartRunner
from embedserve.gateway.routes.pipeline import PoolDirectory as PoolDirectory


class GatewayService(Pipeline):
    async def embed(
        self, req: EmbeddingRequest, traffic_class: str, timeout_s: float | None = None
    ) -> Answer:
        """`/v1/embeddings`: split per input by token count, reassembled in order."""
        return await self.serve(EMBEDDINGS_ROUTE, req, traffic_class, timeout_s)
