"""Reassembling a `/v2/embed` answer from its parts (gateway/routes/cohere_embed.py): vectors of every
type back at their text's position, billed tokens summed, metadata joined, mixed schemas refused."""

from __future__ import annotations

from typing import Any

import pytest

from embedserve.api.protocol import ApiError
from embedserve.api.routes import COHERE_EMBED_PATH
from embedserve.gateway.pools.forward import Part, PartResult
from embedserve.gateway.routes.cohere_embed import assemble

TEXTS = ["q0", "d1", "q2", "d3"]


def _result(pool: str, indices: list[int], **override: Any) -> PartResult:
    body = {
        "id": "pool-id",
        "response_type": "embeddings_by_type",
        "embeddings": {
            "float": [[float(i), 0.5] for i in indices],
            "ubinary": [[i] for i in indices],
        },
        "texts": [TEXTS[i] for i in indices],
        "meta": {"api_version": {"version": "2"}, "billed_units": {"input_tokens": 10 * len(indices)}},
        "model": "pool-model",
        "model_version": "v1",
        "dtype": "float32",
        "backend_profile": f"cpu-{pool}",
        "embedding_schema": "es1-float",
        "embedding_schemas": {"float": "es1-float", "ubinary": "es1-ubinary"},
        **override,
    }
    part = Part((pool,), indices, 0, {"texts": body["texts"]}, COHERE_EMBED_PATH)
    return PartResult(part, pool, body, {}, 0.01)


def test_vectors_of_every_type_go_back_to_their_texts() -> None:
    body = assemble([_result("short", [0, 2]), _result("long", [3, 1])], TEXTS, "gw-model")
    assert body["embeddings"] == {
        "float": [[0.0, 0.5], [1.0, 0.5], [2.0, 0.5], [3.0, 0.5]],
        "ubinary": [[0], [1], [2], [3]],
    }
    assert body["texts"] == TEXTS and body["response_type"] == "embeddings_by_type"
    assert body["meta"] == {"api_version": {"version": "2"}, "billed_units": {"input_tokens": 40}}
    assert body["model"] == "gw-model" and body["id"] != "pool-id"
    assert body["backend_profile"] == "cpu-long,cpu-short" and body["model_version"] == "v1"
    assert body["embedding_schemas"] == {"float": "es1-float", "ubinary": "es1-ubinary"}


@pytest.mark.parametrize(
    "override",
    [
        {"embedding_schema": "es1-other"},
        {"embedding_schemas": {"float": "es1-float", "ubinary": "es1-other"}},  # another calibration
        {"embeddings": {"float": [[1.0, 0.5]]}},  # a type missing
    ],
)
def test_parts_that_disagree_are_refused(override: dict[str, Any]) -> None:
    with pytest.raises(ApiError) as e:
        assemble([_result("short", [0, 2]), _result("long", [1], **override)], TEXTS[:3], None)
    assert e.value.status == 502 and "refusing to mix" in e.value.message
