"""`embedserve gateway` in front of real `embedserve serve` processes on 127.0.0.1.

    short pool (<= 256 tokens):  S1 (tiny Qwen3) + S3 (another model: the guard keeps it out)
    long pool  (<= 2048 tokens): S2 (the same tiny Qwen3)
    routes: online [short, long]; batch [long]

The last test kills S1, so the tests run in file order on one set of processes.
"""

from __future__ import annotations

import base64
import signal
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers.gateway_process import start_gateway, write_config
from tests.helpers.server_process import ServerProcess, start_server, words

SHORT_MAX, LONG_MAX = 256, 2048
SERVER_ARGS = ("--max-num-batched-tokens", "256", "--warmup-lengths", "16")
ROUTES = [{"class": "online", "order": ["short", "long"]}, {"class": "batch", "order": ["long"]}]


@dataclass
class Setup:
    s1: ServerProcess  # short pool
    s2: ServerProcess  # long pool
    s3: ServerProcess  # short pool, different model
    gateway: ServerProcess
    tmp: Path


@pytest.fixture(scope="module")
def setup(qwen3_dir: Path, qwen2_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    tmp = tmp_path_factory.mktemp("gateway")
    servers = [
        start_server(qwen3_dir, tmp, "--max-model-len", str(SHORT_MAX), *SERVER_ARGS),
        start_server(qwen3_dir, tmp, "--max-model-len", str(LONG_MAX), *SERVER_ARGS),
        start_server(qwen2_dir, tmp, "--max-model-len", str(SHORT_MAX), *SERVER_ARGS),
    ]
    gateway = None
    try:
        for s in servers:
            s.wait_ready()
        s1, s2, s3 = servers
        pools = {
            "short": {"max_tokens": SHORT_MAX, "upstreams": [s1.base_url, s3.base_url]},
            "long": {"max_tokens": LONG_MAX, "upstreams": [s2.base_url]},
        }
        config = write_config(tmp / "pools.yaml", qwen3_dir, pools, ROUTES, health_interval_s=0.3)
        gateway = start_gateway(config, tmp)
        gateway.wait_ready()
        yield Setup(s1, s2, s3, gateway, tmp)
    finally:
        if gateway is not None:
            assert gateway.terminate() == 0, gateway.log()
        for s in servers:  # drain all at once (S1 is already dead)
            if s.proc.poll() is None:
                s.proc.send_signal(signal.SIGTERM)
        for s in servers:
            s.proc.wait(60)


def _embed(base_url: str, texts: list[str], **extra: Any) -> httpx.Response:
    return httpx.post(f"{base_url}/v1/embeddings", json={"input": texts, **extra}, timeout=60)


def _vectors(r: httpx.Response) -> np.ndarray:
    assert r.status_code == 200, r.text
    return np.array([d["embedding"] for d in r.json()["data"]], dtype=np.float32)


def _metric(base_url: str, name: str, **labels: str) -> float:
    text = httpx.get(f"{base_url}/metrics").text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    return 0.0


def test_inputs_land_in_the_pool_their_length_and_class_pick(setup: Setup) -> None:
    url = setup.gateway.base_url
    r = _embed(url, [words(10), words(1000)])
    assert r.status_code == 200, r.text
    assert r.headers["x-embedserve-pools"] == "short,long"
    assert [d["pool"] for d in r.json()["data"]] == ["short", "long"]
    # Batch traffic (header or body field) takes the batch route, even for a short input.
    r = httpx.post(
        f"{url}/v1/embeddings", json={"input": words(10)}, headers={"x-embedserve-priority": "batch"}
    )
    assert r.headers["x-embedserve-pools"] == "long"
    assert _embed(url, [words(10)], priority="batch").headers["x-embedserve-pools"] == "long"
    r = httpx.post(f"{url}/v1/embeddings", json={"input": "x"}, headers={"x-embedserve-priority": "urgent"})
    assert r.status_code == 400 and "expected one of ['online', 'batch']" in r.json()["error"]["message"]
    assert _metric(url, "embedserve_gateway_pool_inputs_total", pool="short", traffic_class="online") == 1
    assert _metric(url, "embedserve_gateway_pool_inputs_total", pool="long", traffic_class="batch") == 2
    # The upstreams saw it too: S1 embedded the 11-token input, S2 the 1001-token one.
    assert _metric(setup.s1.base_url, "embedserve_tokens_total") == 11
    assert _metric(setup.s2.base_url, "embedserve_tokens_total") == 1001 + 2 * 11


def test_mixed_request_comes_back_in_order_and_equals_direct_calls(setup: Setup) -> None:
    texts = [words(5), words(600), words(20, seed=1), words(1500, seed=2), words(8, seed=3)]
    short, long = [0, 2, 4], [1, 3]
    r = _embed(setup.gateway.base_url, texts, prompt_name="query")
    got = _vectors(r)
    direct_short = _vectors(_embed(setup.s1.base_url, [texts[i] for i in short], prompt_name="query"))
    direct_long = _vectors(_embed(setup.s2.base_url, [texts[i] for i in long], prompt_name="query"))
    np.testing.assert_allclose(got[short], direct_short, atol=1e-6)
    np.testing.assert_allclose(got[long], direct_long, atol=1e-6)
    body = r.json()
    counts = [d["num_tokens"] for d in body["data"]]
    assert body["usage"]["prompt_tokens"] == sum(counts) and counts[1] > SHORT_MAX >= counts[0]
    assert (
        body["embedding_schema"]
        == httpx.get(f"{setup.s1.base_url}/v1/models").json()["data"][0]["embedding_schema"]
    )
    # base64 is passed through untouched.
    b64 = _embed(setup.gateway.base_url, texts, prompt_name="query", encoding_format="base64").json()
    decoded = np.stack([np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4") for d in b64["data"]])
    np.testing.assert_allclose(decoded, got, atol=1e-6)


def test_over_long_input_gets_400_unless_truncation_is_asked_for(setup: Setup) -> None:
    url = setup.gateway.base_url
    r = _embed(url, [words(10), words(3000)])
    assert r.status_code == 400
    assert f"input 1: 3001 tokens exceed the limit of {LONG_MAX} tokens" in r.json()["error"]["message"]
    r = _embed(url, [words(3000)], truncate="end")
    item = r.json()["data"][0]
    assert r.status_code == 200 and item["truncated"] is True and item["num_tokens"] == LONG_MAX
    assert _metric(url, "embedserve_gateway_rejections_total", reason="too_long", traffic_class="online") == 1


def test_upstream_with_another_schema_is_out_of_rotation(setup: Setup) -> None:
    url, s3 = setup.gateway.base_url, setup.s3.base_url
    detail = httpx.get(f"{url}/health/ready").json()["pools"]["short"]["upstreams"][s3]
    assert detail["in_rotation"] is False and detail["detail"].startswith("SCHEMA MISMATCH")
    assert _metric(url, "embedserve_gateway_upstream_up", pool="short", upstream=s3) == 0
    assert _metric(url, "embedserve_gateway_upstream_up", pool="short", upstream=setup.s1.base_url) == 1
    assert "SCHEMA MISMATCH" in setup.gateway.log()
    for _ in range(4):  # with S3 in rotation, least-outstanding-tokens would have used it
        assert _embed(url, [words(4)]).status_code == 200
    assert _metric(s3, "embedserve_requests_total", status="200") == 0


def test_gateway_refuses_to_start_when_pools_disagree(setup: Setup, qwen3_dir: Path) -> None:
    pools = {
        "short": {"max_tokens": SHORT_MAX, "upstreams": [setup.s3.base_url]},
        "long": {"max_tokens": LONG_MAX, "upstreams": [setup.s2.base_url]},
    }
    config = write_config(setup.tmp / "mixed.yaml", qwen3_dir, pools, ROUTES)
    refused = start_gateway(config, setup.tmp)
    assert refused.proc.wait(60) == 2, refused.log()
    assert "pools serve different embedding schemas" in refused.log()


def test_killed_pool_falls_back_and_nothing_is_lost(setup: Setup) -> None:
    texts = [words(4 + i % 30, seed=i) for i in range(40)]
    url = setup.gateway.base_url
    with ThreadPoolExecutor(4) as pool:
        futures = {pool.submit(_embed, url, [t]): i for i, t in enumerate(texts)}
        replies: dict[int, httpx.Response] = {}
        for f in as_completed(futures):
            replies[futures[f]] = f.result()
            if len(replies) == 8:  # mid-stream: S1 dies without a chance to drain
                setup.s1.proc.send_signal(signal.SIGKILL)
    assert all(r.status_code == 200 for r in replies.values()), [
        r.text for r in replies.values() if r.status_code != 200
    ]
    got = np.concatenate([_vectors(replies[i]) for i in range(len(texts))])
    np.testing.assert_allclose(got, _vectors(_embed(setup.s2.base_url, texts)), atol=1e-6)
    used = {r.headers["x-embedserve-pools"] for r in replies.values()}
    assert used == {"short", "long"}
    assert httpx.get(f"{url}/health/ready").status_code == 200  # online still has the long pool
    assert _embed(url, [words(4)]).headers["x-embedserve-pools"] == "long"
    fallbacks = sum(
        _metric(
            url, "embedserve_gateway_fallbacks_total", pool="short", traffic_class="online", reason=reason
        )
        for reason in ("unreachable", "unavailable")
    )
    assert fallbacks >= 1
