"""`POST /v1/embeddings` through the gateway (gateway/pipeline.py, split per input): each input
counted with its prompt, parts sent with the client's options, vectors back at their input's
position, usage summed, metadata joined; parts of different embedding schemas refused (502)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from embedserve.api.multimodal import to_json
from embedserve.api.protocol import ApiError, EmbeddingRequest
from embedserve.api.routes import EMBEDDINGS
from embedserve.gateway.forward import PartResult
from embedserve.gateway.jobs import Job
from embedserve.gateway.pipeline import GatewayRoute, Pipeline

log = logging.getLogger(__name__)

_METADATA = ("model_version", "dtype", "backend_profile")


class EmbeddingsJob(Job[EmbeddingRequest]):
    def __init__(self, gw: Pipeline, req: EmbeddingRequest) -> None:
        self.items = req.items
        super().__init__(req, req.model, len(self.items), req.truncate)
        self.counter = gw.counter
        self.metrics = gw.metrics

    def count(self) -> list[int]:
        prompt = self.counter.resolve_prompt(self.req.prompt_name, self.req.prompt)
        return self.counter.count(self.items, prompt)

    def payload(self, indices: Sequence[int], traffic_class: str) -> dict[str, Any]:
        # The client's options as sent (defaults left to the upstream); `model` is dropped because
        # each upstream may serve the model under its own name (the schema guard vouches for it).
        body = self.req.model_dump(exclude_unset=True, exclude={"model", "input", "priority"})
        body["input"] = [to_json(self.items[i]) for i in indices]
        body["priority"] = traffic_class
        return body

    def body(self, results: Sequence[PartResult], counts: Sequence[int], name: str | None) -> dict[str, Any]:
        schemas = {r.body.get("embedding_schema") for r in results}
        if len(schemas) != 1:
            # The guard keeps mixed schemas out of rotation; this is the last line of defence.
            found = {r.pool: r.body.get("embedding_schema") for r in results}
            raise ApiError(
                502,
                f"pools answered with different embedding schemas {found}; refusing to mix them",
                "server_error",
            )
        data: list[dict[str, Any]] = [{} for _ in counts]
        prompt_tokens = total_tokens = 0
        for r in results:
            for item in r.body["data"]:
                i = r.part.indices[item["index"]]
                data[i] = {**item, "index": i, "pool": r.pool}
                if not item.get("truncated") and item.get("num_tokens", counts[i]) != counts[i]:
                    self.metrics.count_mismatches.labels(r.pool).inc()
                    log.warning(
                        "input %d: the gateway counted %d tokens, pool %r counted %s: is the gateway's "
                        "--model the pools' model?", i, counts[i], r.pool, item.get("num_tokens"),
                    )  # fmt: skip
            usage = r.body.get("usage") or {}
            prompt_tokens += int(usage.get("prompt_tokens", 0))
            total_tokens += int(usage.get("total_tokens", 0))
        meta = {key: ",".join(sorted({str(r.body.get(key)) for r in results})) for key in _METADATA}
        return {
            "object": "list",
            "data": data,
            "usage": {"prompt_tokens": prompt_tokens, "total_tokens": total_tokens},
            "model": name or str(results[0].body.get("model")),
            **meta,
            "embedding_schema": schemas.pop(),
        }


EMBEDDINGS_ROUTE = GatewayRoute(EMBEDDINGS, EmbeddingsJob)
