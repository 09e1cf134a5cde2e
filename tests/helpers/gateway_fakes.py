"""Fake upstreams for gateway unit tests (httpx.MockTransport): they answer like `embedserve
serve`, and can refuse, fail, be slow, or answer a deadline 503; they record what they got."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import httpx

from embedserve.gateway.pools.config import GatewayConfig, parse_config
from embedserve.gateway.pools.counting import TokenCounter
from embedserve.gateway.pools.forward import Forwarder
from embedserve.gateway.pools.metrics import GatewayMetrics
from embedserve.gateway.pools.upstreams import UpstreamSet
from embedserve.gateway.service import GatewayService

SHORT, LONG, SHORT2 = "http://short:1", "http://long:2", "http://short2:3"
SCHEMA = "es1-test"


class FakeUpstream:
    """Answers like `embedserve serve`; `status` / `raises` / `error_type` / `delay` make it
    refuse, fail or wait; `inputs` and `headers` record the calls it got (texts or documents) on
    every POST route (`/v1/embeddings`, `/v2/embed`, `/v1/rerank`, `/classify`, `/predict`,
    `/v1/score`, `/tokenize`, `/detokenize`, `/similarity`, `/decode`, `/embed_all`, `/pooling`)."""

    def __init__(self, url: str, schema: str = SCHEMA) -> None:
        self.url = url
        self.schema = schema
        self.status = 200
        self.retry_after = "1"
        self.error_type = "service_unavailable"
        self.delay = 0.0
        self.raises: Exception | None = None
        self.inputs: list[list[str]] = []
        self.headers: list[httpx.Headers] = []

    def answer(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/health/ready":
            return httpx.Response(200, json={"status": "ready"})
        if path == "/v1/models":
            card = {"id": "tiny", "embedding_schema": self.schema, "max_model_len": 4096}
            return httpx.Response(200, json={"object": "list", "data": [card]})
        self.headers.append(request.headers)
        if self.raises is not None:
            raise self.raises
        if self.status != 200:
            body = {"error": {"message": f"status {self.status}", "type": self.error_type}}
            return httpx.Response(self.status, json=body, headers={"Retry-After": self.retry_after})
        sent = json.loads(request.content)
        if path == "/v2/embed":
            return self._cohere(sent["texts"])
        if path == "/v1/rerank":
            return self._rerank(sent["documents"])
        if path in _OTHERS:
            return _OTHERS[path](self, sent)
        texts = sent["input"]
        self.inputs.append(texts)
        sparse = sent.get("embedding_type") == "sparse"  # as a SPLADE model's: indices and values
        data = [
            # The vector encodes the text and the server, so order and origin are checkable.
            {
                "object": "embedding",
                "index": i,
                "embedding": {"indices": [len(t)], "values": [float(self.url[-1])]}
                if sparse
                else [len(t), float(self.url[-1])],
                "num_tokens": len(t.split()) + 1,
            }
            for i, t in enumerate(texts)
        ]
        n = sum(d["num_tokens"] for d in data)
        return self._answered({"data": data, "usage": {"prompt_tokens": n, "total_tokens": n}})

    def _cohere(self, texts: list[str]) -> httpx.Response:
        """`/v2/embed` in float, each vector as `/v1/embeddings` makes it."""
        self.inputs.append(texts)
        vectors = [[len(t), float(self.url[-1])] for t in texts]
        n = sum(len(t.split()) + 1 for t in texts)
        meta = {"api_version": {"version": "2"}, "billed_units": {"input_tokens": n}}
        body = {"response_type": "embeddings_by_type", "embeddings": {"float": vectors}, "texts": texts}
        return self._answered({**body, "meta": meta, "embedding_schemas": {"float": self.schema}})

    def _rerank(self, documents: list[str]) -> httpx.Response:
        """`/v1/rerank`: the longest document first (the pool's number as the score's tenths)."""
        self.inputs.append(documents)
        order = sorted(range(len(documents)), key=lambda i: -len(documents[i]))
        results = [{"index": i, "relevance_score": float(self.url[-1]) / 10} for i in order]
        n = len(documents)
        return self._answered({"results": results, "usage": {"prompt_tokens": n, "total_tokens": n}})

    def _score(self, sent: dict[str, Any]) -> httpx.Response:
        """`/v1/score`: each pair's score is its text_2's length."""
        right = sent["text_2"]
        self.inputs.append(right)
        data = [{"index": i, "object": "score", "score": float(len(t))} for i, t in enumerate(right)]
        return self._answered({"object": "list", "data": data, "usage": {}})

    def _classify(self, sent: dict[str, Any]) -> httpx.Response:
        """`/classify`: two labels, the first's probability the text's length over 1000."""
        texts = sent["input"]
        self.inputs.append(texts)
        data = [
            {"index": i, "label": "a", "probs": [len(t) / 1000, 1 - len(t) / 1000], "num_classes": 2}
            for i, t in enumerate(texts)
        ]
        return self._answered({"object": "list", "data": data, "usage": {}})

    def _predict(self, sent: dict[str, Any]) -> httpx.Response:
        """TEI's `/predict` of a batch: each input's labels, best first."""
        texts = [x[0] for x in sent["inputs"]]
        self.inputs.append(texts)
        labels = [[{"score": len(t) / 1000, "label": "a"}] for t in texts]
        return httpx.Response(200, json=labels, headers=_TIMES)

    def _tokenize(self, sent: dict[str, Any]) -> httpx.Response:
        """`/tokenize` in TEI's shape: one token per word."""
        self.inputs.append(sent["inputs"])
        tokens = [
            [{"id": k, "text": w, "special": False} for k, w in enumerate(t.split())] for t in sent["inputs"]
        ]
        return httpx.Response(200, json=tokens, headers=_TIMES)

    def _detokenize(self, sent: dict[str, Any]) -> httpx.Response:
        self.inputs.append([str(len(sent["tokens"]))])
        return httpx.Response(200, json={"prompt": " ".join("w" for _ in sent["tokens"])}, headers=_TIMES)

    def _similarity(self, sent: dict[str, Any]) -> httpx.Response:
        """TEI's `/similarity`: each sentence's score is its length."""
        sentences = sent["inputs"]["sentences"]
        self.inputs.append(sentences)
        return httpx.Response(200, json=[float(len(t)) for t in sentences], headers=_TIMES)

    def _decode(self, sent: dict[str, Any]) -> httpx.Response:
        """TEI's `/decode`: a word per id."""
        self.inputs.append([str(len(ids)) for ids in sent["ids"]])
        return httpx.Response(200, json=[" ".join("w" for _ in ids) for ids in sent["ids"]], headers=_TIMES)

    def _embed_all(self, sent: dict[str, Any]) -> httpx.Response:
        """TEI's `/embed_all`: a vector per word."""
        texts = sent["inputs"]
        self.inputs.append(texts)
        return httpx.Response(200, json=[[[1.0, 2.0]] * len(t.split()) for t in texts], headers=_TIMES)

    def _pooling(self, sent: dict[str, Any]) -> httpx.Response:
        """vLLM's `/pooling` (embed): each vector as `/v1/embeddings` makes it."""
        texts = sent["input"]
        self.inputs.append(texts)
        data = [
            {"index": i, "object": "pooling", "data": [len(t), float(self.url[-1])]}
            for i, t in enumerate(texts)
        ]
        return self._answered({"object": "list", "data": data, "usage": {}})

    def _answered(self, body: dict[str, Any]) -> httpx.Response:
        meta = {"model": "tiny", "model_version": "v1", "dtype": "float32", "backend_profile": "cpu-fp32"}
        return httpx.Response(200, json={**body, "embedding_schema": self.schema, **meta}, headers=_TIMES)


_TIMES = {"x-queue-time": "1.50", "x-inference-time": "2.00"}
_OTHERS = {
    "/classify": FakeUpstream._classify,
    "/predict": FakeUpstream._predict,
    "/v1/score": FakeUpstream._score,
    "/tokenize": FakeUpstream._tokenize,
    "/detokenize": FakeUpstream._detokenize,
    "/similarity": FakeUpstream._similarity,
    "/decode": FakeUpstream._decode,
    "/embed_all": FakeUpstream._embed_all,
    "/pooling": FakeUpstream._pooling,
}


def fake_config(policy: str = "least_tokens", **extra: Any) -> GatewayConfig:
    return parse_config(
        {
            "balance": policy,
            "pools": {
                "short": {"max_tokens": 64, "upstreams": [SHORT, SHORT2]},
                "long": {"max_tokens": 4096, "upstreams": [LONG]},
            },
            "routes": [
                {"class": "online", "order": ["short", "long"]},
                {"class": "batch", "order": ["long"]},
            ],
            **extra,
        }
    )


Started = tuple[GatewayService, dict[str, FakeUpstream]]


def fake_gateway(counter: TokenCounter) -> Callable[..., Awaitable[Started]]:
    """`await start(policy, **config)`: a gateway service over three fresh fake upstreams."""
    fakes = {u: FakeUpstream(u) for u in (SHORT, SHORT2, LONG)}

    async def start(policy: str = "least_tokens", **extra: Any) -> Started:
        async def route(request: httpx.Request) -> httpx.Response:
            fake = fakes[f"{request.url.scheme}://{request.url.host}:{request.url.port}"]
            if fake.delay and request.url.path not in ("/health/ready", "/v1/models"):
                await asyncio.sleep(fake.delay)
            return fake.answer(request)

        client = httpx.AsyncClient(transport=httpx.MockTransport(route))
        config = fake_config(policy, **extra)
        upstreams = UpstreamSet(config, client)
        await upstreams.start()
        await upstreams.close()  # no background polling in unit tests: state changes are explicit
        metrics = GatewayMetrics(upstreams)
        forwarder = Forwarder(upstreams, metrics, config.balance)
        return GatewayService(config, counter, upstreams, metrics, forwarder), fakes

    return start
