"""`POST /v1/embeddings` through the gateway (gateway/routes/pipeline.py, split per input): each input
counted with its prompt, parts sent with the client's options, vectors back at their input's
position, usage summed, metadata joined; parts of different embedding schemas refused (502)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from embedserve.api.multimodal import to_json
from embedserve.api.protocol import ApiError, EmbeddingRequest
from embedserve.api.routes import EMBEDDINGS
from embedserve.gateway.pools.forward import PartResult
from embedserve.gateway.routes.jobs import Job
from embedserve.gateway.routes.pipeline import GatewayRoute, Pipeline
from embedserve.pooling.outputs import Output
from embedserve.tokenizer.late import LateChunking

log = logging.getLogger(__name__)

_METADATA = ("model_version", "dtype", "backend_profile")


class EmbeddingsJob(Job[EmbeddingRequest]):
    """Each input is a part of its own; a late-chunked document (its chunks, or the document with
    its spans) is one input, counted whole and sent as the client sent it."""

    def __init__(self, gw: Pipeline, req: EmbeddingRequest) -> None:
        self.items = req.items
        # a long late-chunked document may exceed every pool: it goes to the longest, which windows it
        over_long = "end" if req.long_late_chunking else req.truncate
        super().__init__(req, req.model, req.n_outputs or 1, over_long)
        self.counter = gw.counter
        self.metrics = gw.metrics

    def count(self) -> list[int]:
        prompt = self.counter.resolve_prompt(self.req.prompt_name, self.req.prompt)
        if self.req.late_chunking:  # the whole document, as the pool's renderer plans it
            return [self.counter.count_late(self.req.input, LateChunking.of_request(self.req), prompt)]
        if self.req.embedding_type == Output.MULTIVECTOR.value:  # each side's prompt, a query's expansion
            side = self.req.input_type or "document"
            return self.counter.count_multivector(self.items, side, self.req.prompt_name, self.req.prompt)
        if self.counter.renderer.routes_statically(self.req.prompt_name):
            return self.counter.count_static(self.items, prompt)  # inference-free SPLADE's queries
        return self.counter.count(self.items, prompt)

    def payload(self, indices: Sequence[int], traffic_class: str) -> dict[str, Any]:
        # The client's options as sent (defaults left to the upstream); `model` is dropped because
        # each upstream may serve the model under its own name (the schema guard vouches for it).
        body = self.req.model_dump(exclude_unset=True, exclude={"model", "input", "priority"})
        late = self.req.late_chunking
        body["input"] = self.req.input if late else [to_json(self.items[i]) for i in indices]
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
        data = self._late(results) if self.req.late_chunking else self._placed(results, counts)
        usages = [r.body.get("usage") or {} for r in results]
        prompt_tokens = sum(int(u.get("prompt_tokens", 0)) for u in usages)
        total_tokens = sum(int(u.get("total_tokens", 0)) for u in usages)
        meta = {key: ",".join(sorted({str(r.body.get(key)) for r in results})) for key in _METADATA}
        late = {}
        if self.req.late_chunking:  # the document's tokens, windows and overlap, as the pool ran it
            late["late_chunking"] = results[0].body.get("late_chunking")
        return {
            "object": "list",
            "data": data,
            "usage": {"prompt_tokens": prompt_tokens, "total_tokens": total_tokens},
            "model": name or str(results[0].body.get("model")),
            **meta,
            "embedding_schema": schemas.pop(),
            **late,
        }

    def _placed(self, results: Sequence[PartResult], counts: Sequence[int]) -> list[dict[str, Any]]:
        """Each part's vectors at their inputs' positions; a pool that counted an input's tokens
        otherwise than the gateway is counted and logged."""
        data: list[dict[str, Any]] = [{} for _ in counts]
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
        return data

    @staticmethod
    def _late(results: Sequence[PartResult]) -> list[dict[str, Any]]:
        """A late-chunked document's one part: its chunks' vectors as the pool numbered them."""
        (r,) = results
        return [{**item, "pool": r.pool} for item in r.body["data"]]


EMBEDDINGS_ROUTE = GatewayRoute(EMBEDDINGS, EmbeddingsJob)
