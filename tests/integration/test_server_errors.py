"""Bad input, authentication, overload and client disconnects against a real server process."""

from __future__ import annotations

import asyncio
import re
import time
from typing import Any

import httpx
import numpy as np
import pytest

from embedserve import Engine
from tests.helpers.reference import cosine
from tests.helpers.server_process import ServerProcess, words
from tests.integration.conftest import API_KEY, MAX_MODEL_LEN, MAX_QUEUED_INPUTS, MODEL_NAME

AUTH = {"Authorization": f"Bearer {API_KEY}"}


def _post(server: ServerProcess, body: Any = None, content: bytes | None = None, **kw: Any) -> httpx.Response:
    headers = {**AUTH, **kw.pop("headers", {})}
    timeout = kw.pop("timeout", 60)
    return httpx.post(
        server.base_url + "/v1/embeddings", json=body, content=content, headers=headers, timeout=timeout, **kw
    )


def _metric(server: ServerProcess, name: str) -> float:
    text = httpx.get(server.base_url + "/metrics", headers=AUTH).text
    m = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
    assert m, f"{name} not exported"
    return float(m.group(1))


BAD_INPUTS = [
    # (body or raw bytes, status, words the message must contain)
    (b"{not json", 400, "not valid JSON"),
    (b"[1, 2]", 422, "invalid request"),
    ({"input": 5}, 422, "input must be a string"),
    ({"input": ["a", 1]}, 422, "not a mix"),
    ({"input": [[1, "x"]]}, 422, "token ids"),
    ({"input": "a", "encoding_format": "hex"}, 422, "encoding_format"),
    ({"input": "a", "dimension": 8}, 422, "dimension"),
    ({"input": "a", "dimensions": 0}, 422, "dimensions"),
    ({"input": "a", "dimensions": 100000}, 400, "dimensions must be an integer in [1, 64]"),
    ({"input": "a", "truncate": "middle"}, 422, "truncate"),
    ({"input": "a", "priority": "urgent"}, 422, "priority"),
    ({"input": ""}, 400, "empty string"),
    ({"input": []}, 400, "empty"),
    ({"input": [[]]}, 400, "empty token list"),
    ({"input": [[10**9]]}, 400, "outside the vocabulary"),
    ({"input": words(MAX_MODEL_LEN + 10)}, 400, f"exceed the limit of {MAX_MODEL_LEN} tokens"),
    ({"input": "a", "model": "gpt-4"}, 404, "not found"),
    ({"input": ["a"] * (MAX_QUEUED_INPUTS + 1)}, 400, f"limit is {MAX_QUEUED_INPUTS}"),
    ({"input": "a", "prompt_name": "nope"}, 400, "unknown prompt name"),
    ({"input": "a", "prompt_name": "query", "prompt": "x"}, 400, "not both"),
    ({"input": [[1, 2]], "prompt_name": "query"}, 400, "token-id inputs"),
    ({"input": "x" * 1_000_001}, 413, "exceeds the limit"),
]


@pytest.mark.parametrize(
    ("body", "status", "words"), BAD_INPUTS, ids=[str(i) for i in range(len(BAD_INPUTS))]
)
def test_bad_input_gets_its_4xx_then_the_server_still_serves(
    api_server: ServerProcess, body: Any, status: int, words: str
) -> None:
    raw = body if isinstance(body, bytes) else None
    resp = _post(
        api_server,
        None if raw else body,
        content=raw,
        headers={"Content-Type": "application/json"} if raw else {},
    )
    assert resp.status_code == status, resp.text
    assert words in resp.json()["error"]["message"]
    ok = _post(api_server, {"input": "still fine", "model": MODEL_NAME})
    assert ok.status_code == 200 and len(ok.json()["data"][0]["embedding"]) == 64


def test_api_key_guards_the_api_but_not_health(api_server: ServerProcess) -> None:
    url = api_server.base_url
    assert httpx.post(url + "/v1/embeddings", json={"input": "a"}).status_code == 401
    wrong = httpx.post(url + "/v1/embeddings", json={"input": "a"}, headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401 and wrong.headers["www-authenticate"] == "Bearer"
    assert httpx.get(url + "/v1/models").status_code == 401
    assert httpx.get(url + "/metrics").status_code == 401
    assert httpx.get(url + "/health/live").status_code == 200
    assert httpx.get(url + "/health/ready").status_code == 200


def test_overload_answers_429_with_retry_after_and_accepted_requests_are_correct(
    api_server: ServerProcess, ref_engine: Engine
) -> None:
    texts = [words(4000, seed) for seed in range(32)]

    async def fire() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=api_server.base_url, headers=AUTH, timeout=120) as client:
            return await asyncio.gather(*(client.post("/v1/embeddings", json={"input": t}) for t in texts))

    responses = asyncio.run(fire())
    statuses = [r.status_code for r in responses]
    assert set(statuses) <= {200, 429}, statuses
    assert statuses.count(429) > 0 and statuses.count(200) >= 1
    for r in responses:
        if r.status_code == 429:
            assert int(r.headers["retry-after"]) >= 1
            assert "capacity" in r.json()["error"]["message"]
    ok = [i for i, s in enumerate(statuses) if s == 200]
    got = np.array([responses[i].json()["data"][0]["embedding"] for i in ok], dtype=np.float32)
    assert cosine(got, ref_engine.embed([texts[i] for i in ok])).min() >= 0.99999
    assert httpx.get(api_server.base_url + "/health/ready").status_code == 200
    assert _metric(api_server, 'embedserve_requests_total{status="429"}') >= statuses.count(429)


def test_client_disconnect_cancels_its_queued_work(api_server: ServerProcess) -> None:
    # 8 inputs of ~8K tokens: several seconds of engine work if it were not cancelled.
    body = {"input": [words(MAX_MODEL_LEN - 200, seed) for seed in range(MAX_QUEUED_INPUTS)]}
    total_tokens = MAX_QUEUED_INPUTS * (MAX_MODEL_LEN - 199)
    before = _metric(api_server, 'embedserve_requests_total{status="499"}') if _has_499(api_server) else 0.0
    computed_before = _metric(api_server, "embedserve_engine_tokens_computed_total")
    with pytest.raises(httpx.TimeoutException):
        _post(api_server, body, timeout=0.5)
    idle = ("embedserve_admitted_inputs", "embedserve_requests_waiting", "embedserve_requests_running")
    deadline = time.monotonic() + 5.0  # the engine thread aborts at its next step: well within this
    while time.monotonic() < deadline:
        if _has_499(api_server) and all(_metric(api_server, name) == 0 for name in idle):
            break
        time.sleep(0.05)
    assert _metric(api_server, 'embedserve_requests_total{status="499"}') == before + 1
    assert {name: _metric(api_server, name) for name in idle} == dict.fromkeys(idle, 0.0)
    # The engine stopped early: fewer tokens computed than the request held (how many fewer
    # depends on the machine: a fast one computed about half of them in the 0.5 s).
    assert _metric(api_server, "embedserve_engine_tokens_computed_total") - computed_before < total_tokens


def _has_499(server: ServerProcess) -> bool:
    return 'status="499"' in httpx.get(server.base_url + "/metrics", headers=AUTH).text


def test_metrics_export_what_operators_need(api_server: ServerProcess) -> None:
    assert _post(api_server, {"input": ["metrics please", "two"]}).status_code == 200
    text = httpx.get(api_server.base_url + "/metrics", headers=AUTH).text
    for name in (
        "embedserve_requests_total",
        "embedserve_input_tokens_bucket",
        "embedserve_queue_seconds_bucket",
        "embedserve_inference_seconds_bucket",
        "embedserve_tokenization_seconds_bucket",
        'embedserve_request_latency_seconds_bucket{le="0.5",length_bucket="0-1K"}',
        "embedserve_tokens_total",
        "embedserve_tokens_per_second",
        "embedserve_requests_running",
        "embedserve_requests_waiting",
        "embedserve_kv_blocks_used",
        "embedserve_kv_blocks_total",
        "embedserve_preemptions_total",
        "embedserve_warmup_seconds",
        "process_resident_memory_bytes",
    ):
        assert name in text, name
    assert _metric(api_server, "embedserve_warmup_seconds") > 0
    assert _metric(api_server, 'embedserve_requests_total{status="200"}') >= 1
