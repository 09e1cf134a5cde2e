"""Every declared route (api/routes.py) runs on the gateway's one template (gateway/routes/pipeline.py):
the same refusals, placement, fallbacks, upstream errors and deadlines on each, through the
gateway's app over fake upstreams (tests/helpers/gateway_fakes.py). A route whose gateway side
breaks fails here by its name while the others pass; a new route needs its entry in `CASES`."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from embedserve.api.routes import RERANK, ROUTES, Route
from embedserve.gateway.app import create_app
from embedserve.gateway.live import Live
from embedserve.gateway.pools.counting import TokenCounter
from embedserve.gateway.pools.upstreams import UpstreamSet
from embedserve.gateway.routes.pipeline import GatewayRoute
from embedserve.gateway.routes.rerank import PairsJob
from embedserve.gateway.service import POOLS_HEADER, GatewayService
from tests.helpers.gateway_fakes import LONG, SHORT, SHORT2, FakeUpstream, fake_gateway
from tests.helpers.server_process import words
from tests.helpers.tiny_rerankers import build_cross_encoder

Fakes = dict[str, FakeUpstream]


@dataclass(frozen=True)
class Case:
    body: Callable[[list[str]], dict[str, Any]]  # a request of the route with these texts
    refuse_too_long: dict[str, Any] | None  # the route's "error" over-long policy (None: answers all)
    vectors: Callable[[Any], list[Any]] | None = None  # a split route's answers, in input order
    whole: Callable[[Any, list[str]], bool] | None = None  # a whole route's answer to these texts
    many: bool = True  # takes several inputs (the per-request input limit applies)
    inputs: Callable[[list[str]], int] = len  # the inputs a request with these texts holds


def _n_words(texts: list[str]) -> int:
    return sum(len(t.split()) for t in texts)


CASES = {
    "embeddings": Case(
        lambda texts: {"input": texts}, {"truncate": "error"}, lambda b: [d["embedding"] for d in b["data"]]
    ),
    "cohere_embed": Case(
        lambda texts: {"texts": texts}, {"truncate": "NONE"}, lambda b: b["embeddings"]["float"]
    ),
    "rerank": Case(
        lambda texts: {"query": "q", "documents": texts},
        {"truncate": "error"},
        whole=lambda b, texts: [r["index"] for r in b["results"]] == [1, 0],  # the fake's order
    ),
    "classify": Case(
        lambda texts: {"input": texts},
        {"truncate": "error"},
        whole=lambda b, texts: [d["probs"][0] * 1000 for d in b["data"]] == [len(t) for t in texts],
    ),
    "predict": Case(
        lambda texts: {"inputs": [[t] for t in texts]},
        {"truncate": False},
        whole=lambda b, texts: [x[0]["score"] * 1000 for x in b] == [len(t) for t in texts],
    ),
    "score": Case(
        lambda texts: {"text_1": "q", "text_2": texts},
        {"truncate": "error"},
        whole=lambda b, texts: [d["score"] for d in b["data"]] == [len(t) for t in texts],
    ),
    "tei_embed": Case(lambda texts: {"inputs": texts}, {"truncate": False}, lambda b: b),
    "tei_embed_sparse": Case(
        lambda texts: {"inputs": texts},
        {"truncate": False},
        lambda b: [[w["index"], w["value"]] for (w,) in b],  # the fake's one weight per input
    ),
    "tokenize": Case(
        lambda texts: {"inputs": texts},
        None,
        whole=lambda b, texts: [len(t) for t in b] == [len(t.split()) for t in texts],
    ),
    "detokenize": Case(
        lambda texts: {"tokens": [7] * _n_words(texts)},
        None,
        whole=lambda b, texts: len(b["prompt"].split()) == _n_words(texts),
        many=False,
    ),
    "similarity": Case(
        lambda texts: {"inputs": {"source_sentence": "q", "sentences": texts}},
        {"truncate": False},
        whole=lambda b, texts: b == [float(len(t)) for t in texts],
        inputs=lambda texts: len(texts) + 1,  # the source sentence is embedded too
    ),
    "decode": Case(
        lambda texts: {"ids": [[7] * len(t.split()) for t in texts]},
        None,
        whole=lambda b, texts: [len(s.split()) for s in b] == [len(t.split()) for t in texts],
    ),
    "embed_all": Case(
        lambda texts: {"inputs": texts},
        {"truncate": False},
        whole=lambda b, texts: [len(rows) for rows in b] == [len(t.split()) for t in texts],
    ),
    "pooling": Case(
        lambda texts: {"input": texts},
        {"truncate": "error"},
        whole=lambda b, texts: [d["data"][0] for d in b["data"]] == [len(t) for t in texts],
    ),
}
ON_EVERY_ROUTE = pytest.mark.parametrize("route", ROUTES, ids=[r.name for r in ROUTES])


@pytest.fixture(scope="module")
def counters(qwen3_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, TokenCounter]:
    """The gateway's counter by the route's task: an embedding model, a reranker, a classifier."""
    ce_dir = build_cross_encoder(tmp_path_factory.mktemp("ce") / "bert-ce", "bert")
    clf_dir = build_cross_encoder(tmp_path_factory.mktemp("clf") / "bert-clf", "bert", labels=["a", "b"])
    return {
        "embed": TokenCounter(qwen3_dir),
        "rerank": TokenCounter(ce_dir),
        "classify": TokenCounter(clf_dir),
    }


def test_every_declared_route_has_a_case() -> None:
    assert set(CASES) == {r.name for r in ROUTES}


def test_a_route_split_per_input_cannot_take_a_whole_routes_job() -> None:
    split = dataclasses.replace(RERANK, placement="split")  # its parts would each get every input
    with pytest.raises(TypeError, match="'rerank' is split per input"):
        GatewayRoute(split, PairsJob)


def _post(
    counters: dict[str, TokenCounter],
    route: Route[Any],
    texts: list[str],
    check: Callable[[httpx.Response, GatewayService, Fakes], None],
    prepare: Callable[[GatewayService, Fakes], None] = lambda service, fakes: None,
    extra: dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
    **config: Any,
) -> None:
    """POST the route's request with `texts` (+ `extra` fields) to a gateway over fresh fakes
    (`prepare`d first; `config`: pools.yaml keys), then `check` the answer."""

    async def go() -> None:
        service, fakes = await fake_gateway(counters[route.tasks[0]])(**config)
        prepare(service, fakes)
        transport = httpx.ASGITransport(app=create_app(Live.of(service)))
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
            body = {**CASES[route.name].body(texts), **(extra or {})}
            resp = await client.post(route.path, json=body, headers=headers or {})
        check(resp, service, fakes)

    asyncio.run(go())


def _metric(service: GatewayService, name: str, **labels: str) -> float:
    return service.metrics.registry.get_sample_value(f"embedserve_gateway_{name}_total", labels) or 0.0


def _refused(resp: httpx.Response, status: int, message: str) -> None:
    assert resp.status_code == status, resp.text
    assert message in resp.json()["error"]["message"], resp.text


def _untouched(fakes: Fakes) -> None:
    assert all(not f.headers for f in fakes.values())  # refused before any upstream call


def _all_status(
    status: int, error_type: str = "service_unavailable"
) -> Callable[[GatewayService, Fakes], None]:
    def prepare(service: GatewayService, fakes: Fakes) -> None:
        for f in fakes.values():
            f.status, f.error_type = status, error_type

    return prepare


def _no_pool(service: GatewayService, fakes: Fakes) -> None:
    """Every upstream in `fakes` out of rotation (as a failed connection takes it)."""
    upstreams = service.upstreams
    assert isinstance(upstreams, UpstreamSet)
    for url in fakes:
        upstreams.mark_down(url, "connection refused")


@ON_EVERY_ROUTE
def test_refusals_before_any_upstream_call(counters: dict[str, TokenCounter], route: Route[Any]) -> None:
    def check(status: int, message: str, reason: str | None = None) -> Callable[..., None]:
        def checked(resp: httpx.Response, service: GatewayService, fakes: Fakes) -> None:
            _refused(resp, status, message)
            _untouched(fakes)
            assert _metric(service, "requests", traffic_class="online", status=str(status)) == 1
            if reason is not None:
                assert _metric(service, "rejections", traffic_class="online", reason=reason) == 1

        return checked

    _post(counters, route, ["x"], check(404, "this gateway serves 'tiny'"), extra={"model": "other"})
    case = CASES[route.name]
    if case.many:
        _post(
            counters,
            route,
            ["x"] * 5,
            check(400, f"{case.inputs(['x'] * 5)} inputs in one request; the limit is 4"),
            max_inputs_per_request=4,
        )
    if case.refuse_too_long is not None:
        too_long = check(400, "exceed the limit of 4096", "too_long")
        _post(counters, route, [words(5000)], too_long, extra=case.refuse_too_long)

    def unavailable(resp: httpx.Response, service: GatewayService, fakes: Fakes) -> None:
        check(503, "no upstream is ready", "unavailable")(resp, service, fakes)
        assert resp.headers["retry-after"] == "2"  # the health interval

    _post(counters, route, ["x"], unavailable, _no_pool)


@ON_EVERY_ROUTE
def test_placed_by_the_routes_placement(counters: dict[str, TokenCounter], route: Route[Any]) -> None:
    texts = [words(3), words(200)]  # one input per pool

    def check(resp: httpx.Response, service: GatewayService, fakes: Fakes) -> None:
        assert resp.status_code == 200, resp.text
        body = resp.json()
        assert route.answers(body, CASES[route.name].inputs(texts)) and "x-total-time" in resp.headers
        assert resp.headers["x-queue-time"] == "1.50"
        assert _metric(service, "requests", traffic_class="online", status="200") == 1
        vectors = CASES[route.name].vectors
        if route.placement == "split":  # each input to its pool, answers back at their positions
            assert resp.headers[POOLS_HEADER] == "short,long"
            assert fakes[LONG].inputs == [[texts[1]]]
            assert vectors is not None and [v[0] for v in vectors(body)] == [len(t) for t in texts]
        else:  # whole: every input on the longest one's pool, its answer as it is
            assert resp.headers[POOLS_HEADER] == "long"
            assert len(fakes[LONG].inputs) == 1 and not fakes[SHORT].inputs + fakes[SHORT2].inputs
            whole = CASES[route.name].whole
            assert whole is not None and whole(body, texts), body

    _post(counters, route, texts, check)


@ON_EVERY_ROUTE
def test_a_saturated_pool_falls_back_along_the_route(
    counters: dict[str, TokenCounter], route: Route[Any]
) -> None:
    def saturate_short(service: GatewayService, fakes: Fakes) -> None:
        fakes[SHORT].status = fakes[SHORT2].status = 429

    def check(resp: httpx.Response, service: GatewayService, fakes: Fakes) -> None:
        assert resp.status_code == 200 and resp.headers[POOLS_HEADER] == "long", resp.text
        labels = {"pool": "short", "traffic_class": "online"}
        assert _metric(service, "fallbacks", reason="rejected", **labels) == 1
        assert _metric(service, "pool_requests", outcome="rejected", **labels) == 2

    _post(counters, route, [words(3)], check, saturate_short)

    def saturated(resp: httpx.Response, service: GatewayService, fakes: Fakes) -> None:
        _refused(resp, 429, "no capacity")
        assert resp.headers["retry-after"] == "1"
        assert _metric(service, "rejections", traffic_class="online", reason="no_capacity") == 1

    _post(counters, route, [words(3)], saturated, _all_status(429))

    def short_down(service: GatewayService, fakes: Fakes) -> None:
        _no_pool(service, {SHORT: fakes[SHORT], SHORT2: fakes[SHORT2]})

    def placed_on_long(resp: httpx.Response, service: GatewayService, fakes: Fakes) -> None:
        assert resp.status_code == 200 and resp.headers[POOLS_HEADER] == "long", resp.text
        labels = {"pool": "short", "traffic_class": "online", "reason": "unavailable"}
        assert _metric(service, "fallbacks", **labels) == 1  # placed past a pool out of rotation

    _post(counters, route, [words(3)], placed_on_long, short_down)


@ON_EVERY_ROUTE
def test_upstream_errors_are_mapped_alike(counters: dict[str, TokenCounter], route: Route[Any]) -> None:
    def caller_error(resp: httpx.Response, service: GatewayService, fakes: Fakes) -> None:
        _refused(resp, 422, "pool 'short'")  # the pool found the caller's mistake: no fallback
        assert not fakes[LONG].headers

    _post(counters, route, [words(3)], caller_error, _all_status(422))
    _post(counters, route, [words(3)], lambda r, s, f: _refused(r, 502, "HTTP 500"), _all_status(500))


@ON_EVERY_ROUTE
def test_deadlines_alike(counters: dict[str, TokenCounter], route: Route[Any]) -> None:
    def pools_deadline(resp: httpx.Response, service: GatewayService, fakes: Fakes) -> None:
        _refused(resp, 504, "not retried on another pool")
        assert resp.json()["error"]["type"] == "deadline_exceeded"
        assert len(fakes[SHORT].headers) + len(fakes[SHORT2].headers) == 1 and not fakes[LONG].headers

    _post(counters, route, [words(3)], pools_deadline, _all_status(503, "deadline_exceeded"))

    def told(resp: httpx.Response, service: GatewayService, fakes: Fakes) -> None:
        assert resp.status_code == 200, resp.text
        sent = [float(h["x-request-timeout"]) for f in fakes.values() for h in f.headers]
        assert len(sent) == 1 and 1.0 < sent[0] <= 2.0, sent  # the client's 2 s, under the gateway's 20

    _post(counters, route, [words(3)], told, headers={"x-request-timeout": "2"}, request_timeout_s=20)

    sent_at: list[float] = []

    def slow(service: GatewayService, fakes: Fakes) -> None:
        for f in fakes.values():
            f.delay = 5.0  # pools that ignore X-Request-Timeout
        sent_at.append(time.monotonic())  # the request goes out next (not the gateway's build)

    def gateways_deadline(resp: httpx.Response, service: GatewayService, fakes: Fakes) -> None:
        _refused(resp, 504, "deadline of 0.4 s")
        # its own deadline (0.4 s), not the pools' 5 s: under CI's parallel load the answer took 2.7 s
        assert time.monotonic() - sent_at[0] < 4.0
        assert _metric(service, "rejections", traffic_class="online", reason="deadline") == 1

    _post(counters, route, [words(3), words(200)], gateways_deadline, slow, request_timeout_s=0.4)
