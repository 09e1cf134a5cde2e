"""Route declarations (api/routes.py) are the one route list: the server app, the gateway app,
its 404 text and the Ray Serve replica's handler table all answer every declared path, and a
declared route that one of them cannot run is refused at start-up. No model is loaded."""

from __future__ import annotations

import asyncio
import dataclasses
from types import SimpleNamespace
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from embedserve.api.dispatch import DISPATCHES
from embedserve.api.protocol import ApiError
from embedserve.api.refusals import body_priority, model_not_found
from embedserve.api.routes import COHERE_EMBED, EMBEDDINGS, RERANK, ROUTES, Route, route_at, wrong_task
from embedserve.batch.http import POST_PATHS as BATCH_POSTS
from embedserve.gateway.app import create_app as create_gateway_app
from embedserve.gateway.app import handler_for
from embedserve.gateway.live import Live
from embedserve.gateway.pools.forward import Part, answers_every_input
from embedserve.scale.replica import answer as replica_answer
from embedserve.server.app import create_app
from embedserve.server.routes import server_routes
from embedserve.server.runtime import ServerSettings

DECLARED = [(route.name, path) for route in ROUTES for path in route.paths]
# Not a route of the API: a declaration no server module or gateway handler knows.
EXTRA = dataclasses.replace(RERANK, name="extra", path="/v1/extra", aliases=())


def _posts(app: FastAPI) -> set[str]:
    return {r.path for r in app.routes if "POST" in getattr(r, "methods", set())}


@pytest.fixture(scope="module")
def server_app() -> FastAPI:
    return create_app(ServerSettings(model="/no/model/needed"))  # nothing loads before the lifespan


@pytest.fixture(scope="module")
def gateway_app() -> FastAPI:
    config = SimpleNamespace(max_inputs_per_request=4, max_body_bytes=1 << 20, served_model_name=None)
    # no pool in rotation: the generic document (every route's)
    upstreams = SimpleNamespace(model_card=lambda: None)
    service: Any = SimpleNamespace(config=config, upstreams=upstreams, metrics=None)
    return create_gateway_app(Live.of(service))


def test_the_declarations() -> None:
    assert [r.name for r in ROUTES] == [
        "embeddings",
        "cohere_embed",
        "rerank",
        "classify",
        "predict",
        "score",
        "tei_embed",
        "tei_embed_sparse",
        "tokenize",
        "detokenize",
        "similarity",
        "decode",
        "embed_all",
        "pooling",
    ]
    assert RERANK.paths == ("/v1/rerank", "/rerank", "/v2/rerank")
    assert {r.name: r.placement for r in ROUTES} == {
        "embeddings": "split",
        "cohere_embed": "split",
        "rerank": "whole",
        "classify": "whole",
        "predict": "whole",
        "score": "whole",
        "tei_embed": "split",
        "tei_embed_sparse": "split",
        "tokenize": "whole",
        "detokenize": "whole",
        "similarity": "whole",
        "decode": "whole",
        "embed_all": "whole",
        "pooling": "whole",
    }
    assert len({p for _, p in DECLARED}) == len(DECLARED)  # no path declared twice
    for name, path in DECLARED:
        route = route_at(path)
        assert route is not None and route.name == name
    assert route_at("/v1/completions") is None


@pytest.mark.parametrize(("name", "path"), DECLARED)
def test_every_declared_path_is_a_post_route_of_the_server_and_the_gateway(
    server_app: FastAPI, gateway_app: FastAPI, name: str, path: str
) -> None:
    for app in (server_app, gateway_app):
        assert path in _posts(app)
        doc = app.openapi()["paths"][path]["post"]
        assert doc["operationId"].startswith(name) and "requestBody" in doc


def test_the_apps_post_routes_are_the_declared_ones(server_app: FastAPI, gateway_app: FastAPI) -> None:
    declared = {p for _, p in DECLARED} | set(BATCH_POSTS)  # and the batch API's (batch/http.py),
    declared |= {d.path for d in DISPATCHES} | {"/ping"}  # the paths whose body picks the route
    assert _posts(server_app) == declared and _posts(gateway_app) == declared


def test_the_gateways_404_names_every_declared_path_and_how_it_places_it(gateway_app: FastAPI) -> None:
    resp = TestClient(gateway_app).post("/v1/completions", json={})
    message = resp.json()["error"]["message"]
    assert resp.status_code == 404 and "not a route of this gateway" in message
    for _, path in DECLARED:
        assert path in message
    assert "/v1/rerank | /rerank | /v2/rerank (whole)" in message
    assert "/v1/embeddings | /embeddings (split per input)" in message
    assert "/v2/embed (split per input)" in message


def test_the_replica_answers_every_declared_path_and_names_them_on_a_404() -> None:
    meta = SimpleNamespace(schema=lambda: "es1-test")
    runtime: Any = SimpleNamespace(service=SimpleNamespace(metadata=meta), accepting=True)
    metrics: Any = SimpleNamespace()
    reply = asyncio.run(replica_answer(runtime, metrics, "/v1/completions", {}, None))
    assert reply["status"] == 404 and reply["embedding_schema"] == "es1-test"
    message = reply["body"]["error"]["message"]
    for _, path in DECLARED:
        assert repr(path) in message


def test_every_route_is_bound_once_on_the_server_and_the_gateway() -> None:
    assert [b.route for b in server_routes()] == list(ROUTES)
    assert len({handler_for(r) for r in ROUTES}) == len(ROUTES)
    with pytest.raises(LookupError, match="extra"):
        server_routes((*ROUTES, EXTRA))
    with pytest.raises(LookupError, match="extra"):
        handler_for(EXTRA)


def test_a_new_declaration_cannot_take_a_bound_routes_name() -> None:
    # Same name, different route: the server's binding is to the declared one, not the name.
    twin: Route[Any] = dataclasses.replace(RERANK, path="/v1/other")
    with pytest.raises(LookupError, match="rerank"):
        server_routes((EMBEDDINGS, COHERE_EMBED, twin))


@pytest.mark.parametrize(
    ("path", "good", "bad"),
    [
        ("/v1/embeddings", {"data": [{"index": 1}, {"index": 0}]}, {"data": [{"index": 0}, {"index": 0}]}),
        (
            "/v2/embed",
            {"embeddings": {"float": [[0.1], [0.2]], "int8": [[1], [2]]}},
            {"embeddings": {"float": [[0.1]]}},
        ),
        ("/v1/rerank", {"results": [{"index": 1}]}, {"results": [{"index": 2}]}),  # top_n may rank fewer
        ("/v1/rerank", {"results": []}, {"data": []}),
    ],
)
def test_a_pools_answer_holds_one_answer_per_input_by_its_routes_rule(
    path: str, good: dict[str, Any], bad: dict[str, Any]
) -> None:
    part = Part((), [7, 9], 0, {}, path)  # two inputs of the request
    assert answers_every_input(good, part)
    assert not answers_every_input(bad, part)
    assert not answers_every_input(None, part)
    assert not answers_every_input(good, Part((), [7, 9], 0, {}, "/v1/unknown"))


def test_the_shared_refusal_wording() -> None:
    assert wrong_task("m", "rerank") == "model 'm' is a reranker: POST /v1/rerank"
    assert wrong_task("m", "embed") == "model 'm' is an embedding model: POST /v1/embeddings"
    assert wrong_task("m", "classify") == "model 'm' is a classifier: POST /classify"
    err = model_not_found("x" * 500, "tiny", "gateway")
    assert isinstance(err, ApiError) and err.status == 404 and err.kind == "not_found_error"
    assert err.message.endswith("not found; this gateway serves 'tiny'") and len(err.message) < 150


def test_body_priority() -> None:
    req = RERANK.parse(b'{"query": "q", "documents": ["d"]}')
    assert body_priority(req) == ("online", False)
    req = RERANK.parse(b'{"query": "q", "documents": ["d"], "priority": "batch"}')
    assert body_priority(req) == ("batch", True)
    cohere = COHERE_EMBED.parse(b'{"texts": ["t"]}')  # no priority field: online
    assert body_priority(cohere) == ("online", False)
