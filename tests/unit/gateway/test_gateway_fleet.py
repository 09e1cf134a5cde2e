"""One gateway, many models (#46): pools.yaml's `models:` map and `aliases:`, each request's
`model` picking its model's pools; `/v1/models`, readiness and metrics over all of them."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from embedserve.batch.format import BatchLine
from embedserve.gateway.app import create_app
from embedserve.gateway.batch_lines import GatewayLines
from embedserve.gateway.fleet import Fleet
from embedserve.gateway.fleet_config import parse_fleet
from embedserve.gateway.live import Live
from embedserve.gateway.pools.config import GatewayConfigError
from embedserve.gateway.pools.counting import TokenCounter
from embedserve.gateway.routes.embeddings import EMBEDDINGS_ROUTE
from tests.helpers.gateway_fakes import LONG, fake_gateway
from tests.helpers.gateway_process import start_gateway
from tests.helpers.server_process import start_server, words
from tests.helpers.tiny_bert import build_encoder

POOLS = {"p": {"max_tokens": 512, "upstreams": ["http://127.0.0.1:9001"]}}
ROUTES = [{"class": "online", "order": ["p"]}]


def _entry(**extra: Any) -> dict[str, Any]:
    return {"model": "/m", "pools": POOLS, "routes": ROUTES, **extra}


def test_the_models_map_gives_each_model_its_config_and_shares_the_rest() -> None:
    fleet = parse_fleet(
        {
            "models": {"a": _entry(), "b": _entry()},
            "aliases": {"latest": "b"},
            "timeout_s": 30,
            "balance": "round_robin",
        }
    )
    assert [m.served_model_name for m in fleet.models] == ["a", "b"] and not fleet.single
    assert all(m.timeout_s == 30 and m.balance == "round_robin" and m.model == "/m" for m in fleet.models)
    assert fleet.aliases == {"latest": "b"}
    one = parse_fleet({"pools": POOLS, "routes": ROUTES})  # the single-model form, as before
    assert one.single and one.models[0].served_model_name is None


def test_a_models_adapters_are_served_names_of_its_pools() -> None:
    pinned = {name: {**pool, "schema": "es1-0123456789abcdef"} for name, pool in POOLS.items()}
    fleet = parse_fleet(
        {"models": {"a": {**_entry(pools=pinned), "adapters": ["x", "y"]}}, "aliases": {"z": "x"}}
    )
    assert [(m.served_model_name, m.adapter) for m in fleet.models] == [("a", None), ("x", "x"), ("y", "y")]
    assert [p.name for p in fleet.models[1].pools] == [p.name for p in fleet.models[0].pools]
    # the base model's pinned schema is not the adapter's
    assert all(p.schema for p in fleet.models[0].pools) and not any(p.schema for p in fleet.models[1].pools)
    assert fleet.aliases == {"z": "x"}


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"models": {}}, "models: expected a non-empty mapping"),
        ({"models": {"a": _entry()}, "pools": POOLS}, "each model sets its own (models.NAME.pools)"),
        ({"models": {"a": _entry(timeout_s=3)}}, "models.a: unknown keys ['timeout_s']"),
        ({"models": {"a": {"pools": POOLS, "routes": ROUTES}}}, "models.a: missing 'model'"),
        ({"models": {"a b": _entry()}}, "models.a b: a served model name is"),
        (
            {"models": {"a": _entry(routes=[{"class": "online", "order": ["x"]}])}},
            "models.a: routes[0].order",
        ),
        ({"models": {"a": _entry()}, "aliases": {"x": "b"}}, "aliases.x: 'b' is not a served model"),
        ({"models": {"a": _entry()}, "aliases": {"a": "a"}}, "aliases.a: is already a served model's name"),
        ({"models": {"a": _entry(adapters="x")}}, "models.a.adapters: expected a list"),
        ({"models": {"a": _entry(adapters=["b"]), "b": _entry()}}, "models: ['b'] named twice"),
        (
            {"pools": POOLS, "routes": ROUTES, "aliases": {"x": "a"}},
            "aliases: name models of a 'models:' map",
        ),
    ],
)
def test_a_bad_models_map_names_the_key(raw: dict[str, Any], message: str) -> None:
    with pytest.raises(GatewayConfigError, match=re.escape(message)):
        parse_fleet(raw)


Check = Callable[[httpx.AsyncClient, dict[str, Any]], Any]


def _fleet_app(counter: TokenCounter, check: Check) -> None:
    """Two models ('a', 'b', alias 'latest' -> 'b') over separate fakes, behind one app."""

    async def go() -> None:
        (a, fakes_a), (b, fakes_b) = [
            await fake_gateway(counter)(served_model_name=name) for name in ("a", "b")
        ]
        app = create_app(Live.of(Fleet([a, b], {"latest": "b"})))
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as client:
            await check(client, {"a": fakes_a, "b": fakes_b})

    asyncio.run(go())


@pytest.fixture(scope="module")
def counter(qwen3_dir: Path) -> TokenCounter:
    return TokenCounter(qwen3_dir)


def test_each_request_goes_to_its_models_pools_and_an_alias_to_its_target(counter: TokenCounter) -> None:
    async def check(client: httpx.AsyncClient, fakes: dict[str, Any]) -> None:
        short, long = words(5), words(300)
        r = await client.post("/v1/embeddings", json={"model": "a", "input": [short, long]})
        assert r.status_code == 200, r.text
        assert r.json()["model"] == "a" and [d["pool"] for d in r.json()["data"]] == ["short", "long"]
        assert fakes["a"][LONG].inputs == [[long]] and not fakes["b"][LONG].inputs
        r = await client.post("/v1/embeddings", json={"model": "latest", "input": long})
        assert r.status_code == 200 and r.json()["model"] == "b", r.text
        assert fakes["b"][LONG].inputs == [[long]] and fakes["a"][LONG].inputs == [[long]]
        r = await client.post("/v1/embeddings", json={"model": "c", "input": short})
        assert r.status_code == 404
        assert (
            r.json()["error"]["message"]
            == "model 'c' not found; this gateway serves 'a', 'b' (aliases: 'latest' -> 'b')"
        )
        r = await client.post("/v1/embeddings", json={"input": short})
        assert r.status_code == 400 and "'model' is required" in r.json()["error"]["message"]
        listed = (await client.get("/v1/models")).json()["data"]
        assert [(m["id"], m["aliases"]) for m in listed] == [("a", []), ("b", ["latest"])]
        card = (await client.get("/v1/models/latest")).json()
        assert card["id"] == "b" and card["aliases"] == ["latest"]
        assert (await client.get("/v1/models/c")).status_code == 404
        ready = (await client.get("/health/ready")).json()
        assert ready["status"] == "ready" and set(ready["models"]) == {"a", "b"}
        metrics = (await client.get("/metrics")).text
        assert (
            'embedserve_gateway_pool_inputs_total{model="a",pool="long",traffic_class="online"} 1.0'
            in metrics
        )
        assert (
            'embedserve_gateway_pool_inputs_total{model="b",pool="long",traffic_class="online"} 1.0'
            in metrics
        )
        assert metrics.count("# TYPE embedserve_gateway_pool_inputs_total counter") == 1

    _fleet_app(counter, check)


def test_batch_lines_go_to_their_models_pools(counter: TokenCounter) -> None:
    """The batch API's lines on a many-model gateway: each line's `model` picks its pools (an
    alias its target's); an unknown one is the line's 404, found at validation."""

    async def go() -> None:
        (a, fakes_a), (b, fakes_b) = [
            await fake_gateway(counter)(served_model_name=name) for name in ("a", "b")
        ]
        lines = GatewayLines(Live.of(Fleet([a, b], {"latest": "b"})), retries=0)

        def line(i: int, model: str) -> BatchLine:
            body = json.dumps({"model": model, "input": words(5 + i)}).encode()
            return BatchLine(i, f"r{i}", EMBEDDINGS_ROUTE.route, "/v1/embeddings", body)

        results = [await lines(line(i, m)) for i, m in enumerate(("a", "latest", "b"))]
        assert [r.status for r in results] == [200, 200, 200]
        assert [r.body["model"] for r in results] == ["a", "b", "b"]
        assert len(fakes_a[LONG].inputs) == 1 and len(fakes_b[LONG].inputs) == 2  # batch: long pool
        refused = await lines.validate(line(3, "c"))
        assert refused is not None and refused.status == 404 and "this gateway serves" in refused.message
        assert await lines.validate(line(4, "latest")) is None

    asyncio.run(go())


# CI time (2026-12-07): the fleet's routing stays in CI over fakes, and real models in test_scale_fleet
@pytest.mark.slow
def test_two_real_models_behind_one_gateway_answer_as_their_own_servers(
    qwen3_dir: Path, tmp_path: Path
) -> None:
    """A decoder and an encoder, each its own server with two pools in front of it: every
    vector through the gateway equals the model's own server's, by name and by alias."""
    bert = build_encoder(tmp_path / "bert", "bert")
    # deterministic: a vector does not depend on what it was batched with (the gateway splits by pool)
    servers = [
        start_server(m, tmp_path, "--deterministic", "--warmup-lengths", "8") for m in (qwen3_dir, bert)
    ]
    gateway = None
    try:
        for s in servers:
            s.wait_ready()

        def entry(model: Path, url: str) -> dict[str, Any]:
            pools = {
                "short": {"max_tokens": 16, "upstreams": [url]},
                "long": {"max_tokens": 64, "upstreams": [url]},
            }
            return {
                "model": str(model),
                "pools": pools,
                "routes": [{"class": "online", "order": ["short", "long"]}],
            }

        config = tmp_path / "pools.yaml"
        models = {"qwen": entry(qwen3_dir, servers[0].base_url), "bert": entry(bert, servers[1].base_url)}
        config.write_text(yaml.safe_dump({"models": models, "aliases": {"embed-latest": "bert"}}))
        gateway = start_gateway(config, tmp_path)
        gateway.wait_ready()
        texts = [words(3), words(40, seed=2), words(5, seed=3)]
        for name, server in (("qwen", servers[0]), ("bert", servers[1]), ("embed-latest", servers[1])):
            got = httpx.post(
                f"{gateway.base_url}/v1/embeddings", json={"model": name, "input": texts}, timeout=60
            )
            direct = httpx.post(f"{server.base_url}/v1/embeddings", json={"input": texts}, timeout=60)
            assert got.status_code == 200, got.text
            assert [d["embedding"] for d in got.json()["data"]] == [
                d["embedding"] for d in direct.json()["data"]
            ]
            assert [d["pool"] for d in got.json()["data"]] == ["short", "long", "short"]
            assert got.json()["model"] == ("bert" if name == "embed-latest" else name)
            assert got.json()["embedding_schema"] == direct.json()["embedding_schema"]
        listed = httpx.get(f"{gateway.base_url}/v1/models").json()["data"]
        assert {m["id"]: m["dimensions"] for m in listed} == {
            "qwen": httpx.get(f"{servers[0].base_url}/v1/models").json()["data"][0]["dimensions"],
            "bert": httpx.get(f"{servers[1].base_url}/v1/models").json()["data"][0]["dimensions"],
        }
    finally:
        for p in [*servers, *([gateway] if gateway else [])]:
            p.terminate()


@pytest.mark.slow  # CI time (2026-12-07): its area keeps a representative in CI
def test_sighup_reloads_models_aliases_and_tenants_without_dropping_a_request(
    qwen3_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Requests keep coming while the config is rewritten and the gateway gets SIGHUP: every one
    is answered, the alias moves at one instant, a second model and a tenant (whose key the
    client already sends) appear; a broken config then leaves it serving as it was."""
    monkeypatch.setenv("RELOAD_TENANT_KEYS", "k1")  # in the gateway's environment from its start
    server = start_server(qwen3_dir, tmp_path, "--warmup-lengths", "8")
    gateway = None
    try:
        server.wait_ready()
        pools = {"all": {"max_tokens": 64, "upstreams": [server.base_url]}}
        entry = {"model": str(qwen3_dir), "pools": pools, "routes": [{"class": "online", "order": ["all"]}]}
        config = tmp_path / "pools.yaml"
        config.write_text(yaml.safe_dump({"models": {"a": entry}, "aliases": {"latest": "a"}}))
        gateway = start_gateway(config, tmp_path)
        gateway.wait_ready()
        url = f"{gateway.base_url}/v1/embeddings"
        statuses: list[tuple[int, str]] = []
        stop = threading.Event()

        def load() -> None:
            with httpx.Client(timeout=30) as c:
                while not stop.is_set():
                    r = c.post(
                        url,
                        json={"model": "latest", "input": words(4)},
                        headers={"Authorization": "Bearer k1"},
                    )
                    statuses.append((r.status_code, r.json().get("model", "")))

        worker = threading.Thread(target=load)
        worker.start()
        time.sleep(1.0)
        tenants = {"t": {"api_keys_env": "RELOAD_TENANT_KEYS", "requests_per_minute": 100000}}
        doc = {"models": {"a": entry, "b": entry}, "aliases": {"latest": "b"}, "tenants": tenants}
        config.write_text(yaml.safe_dump(doc))
        gateway.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 60
        while not statuses or statuses[-1][1] != "b":
            assert time.monotonic() < deadline and gateway.proc.poll() is None, gateway.log()
            time.sleep(0.1)
        time.sleep(0.5)
        stop.set()
        worker.join(30)
        assert {s for s, _ in statuses} == {200}, statuses
        models = [m for _, m in statuses]
        switch = models.index("b")
        assert set(models[:switch]) == {"a"} and set(models[switch:]) == {"b"}  # one swap, no mix after
        assert len(statuses) > 20
        listed = httpx.get(f"{gateway.base_url}/v1/models", headers={"Authorization": "Bearer k1"}).json()
        assert [m["id"] for m in listed["data"]] == ["a", "b"]
        config.write_text("models: {a: {model: 3}}")  # broken: refused, the running config stays
        gateway.proc.send_signal(signal.SIGHUP)
        time.sleep(2)
        r = httpx.post(url, json={"model": "latest", "input": "x"}, headers={"Authorization": "Bearer k1"})
        assert r.status_code == 200 and r.json()["model"] == "b"
        assert "reload of" in gateway.log() and "refused" in gateway.log()
    finally:
        for p in [server, *([gateway] if gateway else [])]:
            p.terminate()
