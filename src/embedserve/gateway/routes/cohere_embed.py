"""`POST /v2/embed` (Cohere) through the gateway: split per text by token count, as
`/v1/embeddings` is (gateway/routes/pipeline.py, embeddings.py).

    texts [q0, d1, q2]  --count-->  [20, 9000, 31]  --place-->  short: texts [q0, q2]   long: [d1]
    each pool answers its texts in every embedding type asked; the vectors of each type go back
    to their text's position; billed input tokens are summed.

Each text's count includes the prompt its `input_type` picks. Every pool gets the client's
options (embedding_types, output_dimension, input_type, truncate), so each vector is the one the
pool would return for the whole request: compressed types are made per vector. Parts run all
or nothing, with the same fallbacks, deadline and errors as `/v1/embeddings`. The answer is
refused (502) unless every part has the same `embedding_schema` and `embedding_schemas`.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from typing import Any

from embedserve.api.cohere import CohereEmbedRequest
from embedserve.api.protocol import ApiError
from embedserve.api.routes import COHERE_EMBED
from embedserve.errors import COHERE_REMEDY
from embedserve.gateway.pools.forward import PartResult
from embedserve.gateway.routes.jobs import Job
from embedserve.gateway.routes.pipeline import GatewayRoute, Pipeline
from embedserve.pooling.outputs import multivectors_only

_METADATA = ("model_version", "dtype", "backend_profile")
_SCHEMAS = ("embedding_schema", "embedding_schemas")


class CohereEmbedJob(Job[CohereEmbedRequest]):
    def __init__(self, gw: Pipeline, req: CohereEmbedRequest) -> None:
        # Counted as the pools count it: the same work as an OpenAI-style request.
        self.inner = req.to_embedding_request(gw.counter.prompts)
        super().__init__(req, req.model, len(req.texts), self.inner.truncate)
        self.counter = gw.counter

    @property
    def truncate_remedy(self) -> str:
        return COHERE_REMEDY

    def count(self) -> list[int]:
        if multivectors_only(self.counter.spec.outputs):  # a ColBERT model: each text on its side
            side = "query" if self.req.input_type == "search_query" else "document"
            return self.counter.count_multivector(self.inner.items, side, None, None)
        prompt = self.counter.resolve_prompt(self.inner.prompt_name, self.inner.prompt)
        return self.counter.count(self.inner.items, prompt)

    def payload(self, indices: Sequence[int], traffic_class: str) -> dict[str, Any]:
        options = self.req.model_dump(exclude_unset=True, exclude={"model", "texts"})
        return {**options, "texts": [self.req.texts[i] for i in indices]}

    def body(self, results: Sequence[PartResult], counts: Sequence[int], name: str | None) -> dict[str, Any]:
        return assemble(results, self.req.texts, name)


def assemble(results: Sequence[PartResult], texts: Sequence[str], name: str | None) -> dict[str, Any]:
    """One Cohere body from the parts' bodies, each vector at its text's position."""
    schemas = {json.dumps([r.body.get(key) for key in _SCHEMAS], sort_keys=True) for r in results}
    kinds = {tuple(r.body["embeddings"]) for r in results}
    if len(schemas) != 1 or len(kinds) != 1:
        # The guard keeps mixed schemas out of rotation; this is the last line of defence.
        found = {r.pool: {key: r.body.get(key) for key in _SCHEMAS} for r in results}
        raise ApiError(
            502,
            f"pools answered with different embedding schemas or types {found}; refusing to mix them",
            "server_error",
        )
    embeddings: dict[str, list[Any]] = {kind: [None] * len(texts) for kind in kinds.pop()}
    billed = 0
    for r in results:
        for kind, vectors in r.body["embeddings"].items():
            for j, vector in enumerate(vectors):
                embeddings[kind][r.part.indices[j]] = vector
        billed += int(r.body.get("meta", {}).get("billed_units", {}).get("input_tokens", 0))
    first = results[0].body
    return {
        "id": str(uuid.uuid4()),
        "response_type": "embeddings_by_type",
        "embeddings": embeddings,
        "texts": list(texts),
        "meta": {
            "api_version": first.get("meta", {}).get("api_version", {"version": "2"}),
            "billed_units": {"input_tokens": billed},
        },
        "model": name or str(first.get("model")),
        **{key: ",".join(sorted({str(r.body.get(key)) for r in results})) for key in _METADATA},
        **{key: first.get(key) for key in _SCHEMAS},
    }


COHERE_EMBED_ROUTE = GatewayRoute(COHERE_EMBED, CohereEmbedJob)
