"""`POST /v2/embed` (Cohere) through the gateway: split per text by token count, as
`/v1/embeddings` is (gateway/service.py).

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
import time
import uuid
from collections.abc import Sequence
from typing import Any

from embedserve.api.cohere import CohereEmbedRequest
from embedserve.api.protocol import ApiError
from embedserve.api.routes import COHERE_EMBED_PATH
from embedserve.gateway.forward import PartResult
from embedserve.gateway.service import GatewayService

Answer = tuple[dict[str, Any], dict[str, str]]
_METADATA = ("model_version", "dtype", "backend_profile")
_SCHEMAS = ("embedding_schema", "embedding_schemas")


async def cohere_embed(
    service: GatewayService, req: CohereEmbedRequest, traffic_class: str, timeout_s: float | None = None
) -> Answer:
    """`timeout_s`: the client's X-Request-Timeout (it shortens the gateway's deadline)."""
    start = time.perf_counter()
    deadline = service.deadline(timeout_s)
    route = service.route_for(traffic_class, req.model)
    name = service.model_name
    inner = req.to_embedding_request(service.counter.prompts)

    def count() -> list[int]:
        prompt = service.counter.resolve_prompt(inner.prompt_name, inner.prompt)
        return service.counter.count(inner.items, prompt)

    counts, placements = await service.place(len(req.texts), count, route, inner.truncate, traffic_class)
    options = req.model_dump(exclude_unset=True, exclude={"model", "texts"})
    results = await service.run_split(
        counts,
        placements,
        lambda idx: {**options, "texts": [req.texts[i] for i in idx]},
        COHERE_EMBED_PATH,
        traffic_class,
        deadline,
    )
    return assemble(results, req.texts, name), service.answered(results, start, traffic_class)


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
