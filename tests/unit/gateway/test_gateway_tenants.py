"""Tenants on the gateway (#46): keys, permissions, quotas (429 + Retry-After from the refill),
one tenant over its quota while another keeps getting answers, metrics per tenant and model."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from embedserve.api.protocol import ApiError
from embedserve.batch.format import BatchLine
from embedserve.batch.online import BATCH_OWNER
from embedserve.gateway.app import create_app
from embedserve.gateway.batch_lines import GatewayLines
from embedserve.gateway.fleet import Fleet
from embedserve.gateway.fleet_config import parse_fleet
from embedserve.gateway.live import Live
from embedserve.gateway.pools.config import GatewayConfigError
from embedserve.gateway.pools.counting import TokenCounter
from embedserve.gateway.routes.embeddings import EMBEDDINGS_ROUTE
from embedserve.gateway.tenancy.quota import Bucket
from embedserve.gateway.tenancy.tenant_config import TenantConfig, parse_tenants
from embedserve.gateway.tenancy.tenants import TENANT_OWNER, Tenants
from tests.helpers.gateway_fakes import LONG, fake_gateway
from tests.helpers.server_process import words

KEYS = {"ACME_KEYS": "acme-1,acme-2", "BETA_KEYS": "beta-1"}


@pytest.fixture(autouse=True)
def _keys(monkeypatch: pytest.MonkeyPatch) -> None:
    for env, value in KEYS.items():
        monkeypatch.setenv(env, value)


@pytest.fixture(scope="module")
def counter(qwen3_dir: Path) -> TokenCounter:
    return TokenCounter(qwen3_dir)


def test_a_bucket_refills_over_time_and_a_big_take_waits_for_a_full_one() -> None:
    now = [0.0]
    bucket = Bucket(60, clock=lambda: now[0])  # one a second, 60 at most
    assert bucket.wait_s(60) == 0
    bucket.take(50)
    assert bucket.wait_s(20) == pytest.approx(10.0)
    now[0] = 10.0
    assert bucket.wait_s(20) == 0
    assert bucket.wait_s(500) == pytest.approx(40.0)  # over a minute's worth: waits for a full one
    now[0] = 50.0
    assert bucket.wait_s(500) == 0
    bucket.take(500)  # and leaves it in debt
    assert bucket.wait_s(1) == pytest.approx(441.0)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({}, "tenants: expected a non-empty mapping"),
        ({"a": {}}, "tenants.a: give its keys' api_keys_env (a variable) or api_keys_file"),
        ({"a": {"api_keys_env": "X", "api_keys_file": "/k"}}, "tenants.a: give its keys' api_keys_env"),
        ({"a": {"api_keys_file": ""}}, "tenants.a.api_keys_file: expected a non-empty string"),
        ({"a": {"api_keys_env": "X", "quota": 1}}, "tenants.a: unknown keys ['quota']"),
        ({"a": {"api_keys_env": "X", "models": ["z"]}}, "tenants.a.models: unknown ['z']"),
        ({"a": {"api_keys_env": "X", "classes": ["bulk"]}}, "tenants.a.classes: unknown ['bulk']"),
        (
            {"a": {"api_keys_env": "X", "tokens_per_minute": 0}},
            "tenants.a.tokens_per_minute: expected a positive",
        ),
        ({"a": {"api_keys_env": "X", "weight": -1}}, "tenants.a.weight: expected a positive number"),
    ],
)
def test_a_bad_tenant_names_the_key(raw: dict[str, Any], message: str) -> None:
    with pytest.raises(GatewayConfigError, match=re.escape(message)):
        parse_tenants(raw, {"a", "b"})


def test_tenants_load_with_the_models_map_and_their_keys_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    entry = {"model": "/m", "pools": {"p": {"max_tokens": 8, "upstreams": ["http://h:1"]}}}
    entry["routes"] = [{"class": "online", "order": ["p"]}]
    raw = {"models": {"a": entry}, "aliases": {"x": "a"}, "tenants": {"t": {"api_keys_env": "ACME_KEYS"}}}
    fleet = parse_fleet({**raw, "tenants": {"t": {"api_keys_env": "ACME_KEYS", "models": ["x"]}}})
    assert fleet.tenants[0].models == {"x"} and fleet.tenants[0].api_keys() == ("acme-1", "acme-2")
    monkeypatch.delenv("ACME_KEYS")
    with pytest.raises(GatewayConfigError, match=r"\$ACME_KEYS holds no key"):
        parse_fleet(raw).tenants[0].api_keys()


TENANTS = (
    TenantConfig("acme", "ACME_KEYS", models=frozenset({"a"}), tokens_per_minute=60, requests_per_minute=3),
    TenantConfig("beta", "BETA_KEYS", classes=frozenset({"online"}), max_concurrent_requests=1),
)
Check = Callable[[httpx.AsyncClient, dict[str, Any], Tenants], Awaitable[None]]


def _tenant_app(counter: TokenCounter, check: Check, tenants: tuple[TenantConfig, ...] = TENANTS) -> None:
    """Models 'a' and 'b' over separate fakes; tenants acme (model a only, 60 tokens and 3
    requests a minute) and beta (online only, one request at a time); the gateway's own key
    'ops'."""

    async def go() -> None:
        (a, fakes_a), (b, fakes_b) = [
            await fake_gateway(counter)(served_model_name=name) for name in ("a", "b")
        ]
        fleet = Fleet([a, b])
        registry = Tenants(tenants)
        app = create_app(Live.of(fleet, registry), ("ops",))
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as client:
            await check(client, {"a": fakes_a, "b": fakes_b}, registry)

    asyncio.run(go())


def _as(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def _embed(client: httpx.AsyncClient, key: str | None, **body: Any) -> httpx.Response:
    return await client.post(
        "/v1/embeddings", json={"input": words(3), **body}, headers=_as(key) if key else {}
    )


def test_keys_permissions_and_quotas(counter: TokenCounter) -> None:
    async def check(client: httpx.AsyncClient, fakes: dict[str, Any], tenants: Tenants) -> None:
        assert (await _embed(client, None, model="a")).status_code == 401
        assert (await _embed(client, "acme-3", model="a")).status_code == 401
        r = await _embed(client, "acme-1", model="b")
        assert r.status_code == 403 and r.json()["error"]["message"] == (
            "tenant 'acme' may not use model 'b'; it may use ['a']"
        )
        r = await _embed(client, "beta-1", model="a", priority="batch")
        assert r.status_code == 403 and "tenant 'beta' may not send 'batch' traffic" in r.text
        # acme: 60 tokens a minute; words(3) is 4 tokens, words(40) 41.
        assert (await _embed(client, "acme-1", model="a", input=words(40))).status_code == 200
        r = await _embed(client, "acme-2", model="a", input=words(40))  # another key, the same tenant
        assert r.status_code == 429 and "over its quota of 60 tokens per minute (41 asked)" in r.text
        assert r.headers["retry-after"] == "22"  # 41 - 19 left = 22 tokens at one a second
        assert (await _embed(client, "acme-1", model="a")).status_code == 200  # 4 fit
        r = await _embed(client, "acme-1", model="a")  # the 4th request of the minute (403s count none)
        assert r.status_code == 429 and "3 requests per minute" in r.text and r.headers["retry-after"] == "20"
        for _ in range(5):  # another tenant, and the gateway's own key, are untouched
            assert (await _embed(client, "beta-1", model="b")).status_code == 200
            assert (await _embed(client, "ops", model="b")).status_code == 200
        assert (await client.get("/metrics", headers=_as("acme-1"))).status_code == 401  # operators only
        metrics = (await client.get("/metrics", headers=_as("ops"))).text
        online = 'traffic_class="online"'
        for line in (
            f'tenant_requests_total{{model="a",status="200",tenant="acme",{online}}} 2.0',
            f'tenant_requests_total{{model="a",status="429",tenant="acme",{online}}} 2.0',
            f'tenant_tokens_total{{model="a",tenant="acme",{online}}} 45.0',
            'tenant_rejections_total{reason="tokens_per_minute",tenant="acme"} 1.0',
            'tenant_rejections_total{reason="model",tenant="acme"} 1.0',
            f'tenant_requests_total{{model="b",status="200",tenant="beta",{online}}} 5.0',
        ):
            assert f"embedserve_gateway_{line}" in metrics, line
        assert tenants.by_name["acme"].active == tenants.by_name["beta"].active == 0

    _tenant_app(counter, check)


def test_a_tenant_lists_reads_and_is_told_of_only_the_models_it_may_use(counter: TokenCounter) -> None:
    async def check(client: httpx.AsyncClient, fakes: dict[str, Any], tenants: Tenants) -> None:
        async def ids(key: str) -> list[str]:
            r = await client.get("/v1/models", headers=_as(key))
            assert r.status_code == 200, r.text
            return [card["id"] for card in r.json()["data"]]

        assert await ids("acme-1") == ["a"]  # acme may use model a only
        assert await ids("beta-1") == await ids("ops") == ["a", "b"]
        assert (await client.get("/v1/models/a", headers=_as("acme-2"))).json()["id"] == "a"
        r = await client.get("/v1/models/b", headers=_as("acme-1"))
        assert r.status_code == 403 and "tenant 'acme' may not use model 'b'; it may use ['a']" in r.text
        assert (await client.get("/v1/models/b", headers=_as("ops"))).status_code == 200
        assert (await client.get("/v1/models", headers=_as("acme-3"))).status_code == 401
        for r in (
            await _embed(client, "acme-1", model="zz"),
            await client.get("/v1/models/zz", headers=_as("acme-1")),
        ):
            assert (
                r.status_code == 404
                and r.json()["error"]["message"] == "model 'zz' not found; this gateway serves 'a'"
            )
        r = await _embed(client, "ops", model="zz")
        assert r.status_code == 404 and r.json()["error"]["message"].endswith("this gateway serves 'a', 'b'")

    _tenant_app(counter, check)


def test_a_tenant_allowed_a_models_alias_may_use_it_by_any_of_its_names(counter: TokenCounter) -> None:
    """`models: [latest]` where latest -> a: the tenant lists, reads and calls a by either name
    (Fleet.names_of), is refused b, and TEI's /info (the first model, a) answers it."""
    only_alias = (TenantConfig("acme", "ACME_KEYS", models=frozenset({"latest"})),)
    only_b = (TenantConfig("beta", "BETA_KEYS", models=frozenset({"b"})),)

    async def go() -> None:
        (a, _), (b, _) = [await fake_gateway(counter)(served_model_name=name) for name in ("a", "b")]
        app = create_app(Live.of(Fleet([a, b], {"latest": "a"}), Tenants(only_alias + only_b)), ("ops",))
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as client:
            cards = (await client.get("/v1/models", headers=_as("acme-1"))).json()["data"]
            assert [(c["id"], c["aliases"]) for c in cards] == [("a", ["latest"])]
            for name in ("a", "latest"):
                assert (await client.get(f"/v1/models/{name}", headers=_as("acme-1"))).status_code == 200
                assert (await _embed(client, "acme-1", model=name)).status_code == 200
            assert (await _embed(client, "acme-1", model="b")).status_code == 403
            r = await _embed(client, "acme-1", model="zz")
            assert r.json()["error"]["message"].endswith("serves 'a' (aliases: 'latest' -> 'a')")
            assert (await client.get("/info", headers=_as("acme-1"))).status_code == 200
            r = await client.get("/info", headers=_as("beta-1"))  # the first model is a
            assert r.status_code == 403 and "tenant 'beta' may not use model 'a'" in r.text

    asyncio.run(go())


def test_concurrent_requests_over_the_limit_are_refused_not_queued(counter: TokenCounter) -> None:
    async def check(client: httpx.AsyncClient, fakes: dict[str, Any], tenants: Tenants) -> None:
        for f in fakes["b"].values():
            f.delay = 0.5
        first = asyncio.ensure_future(_embed(client, "beta-1", model="b", input=words(300)))
        await asyncio.sleep(0.2)
        r = await _embed(client, "beta-1", model="b")
        assert r.status_code == 429 and "1 concurrent requests" in r.text and r.headers["retry-after"] == "1"
        assert (await first).status_code == 200
        assert (await _embed(client, "beta-1", model="b")).status_code == 200  # its slot is back
        assert fakes["b"][LONG].inputs == [[words(300)]]

    _tenant_app(counter, check)


def test_every_key_of_a_tenant_owns_the_same_batch_files() -> None:
    tenants = Tenants(TENANTS)
    acme = {tenants.owner_of_key(k) for k in ("acme-1", "acme-2")}
    assert len(acme) == 1 and acme != {tenants.owner_of_key("beta-1")}
    assert tenants.owner_of_key("ops") not in acme | {tenants.owner_of_key("beta-1")}


def test_two_tenants_sharing_a_key_is_a_startup_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BETA_KEYS", "beta-1,acme-2")
    with pytest.raises(GatewayConfigError, match="tenants 'acme' and 'beta' share a key"):
        Tenants(TENANTS)


def test_a_key_no_longer_a_tenants_after_a_reload_is_refused_not_let_through() -> None:
    tenants = Tenants(TENANTS)
    assert tenants.of_request({"authorization": "Bearer acme-1"}, ("ops",)) is tenants.by_name["acme"]
    assert tenants.of_request({"authorization": "Bearer ops"}, ("ops",)) is None  # an operator
    with pytest.raises(ApiError) as refused:
        tenants.of_request({"authorization": "Bearer gone-key"}, ("ops",))
    assert refused.value.status == 401


def test_a_reload_keeps_a_tenants_running_requests_and_unchanged_quotas(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    old = Tenants(TENANTS)
    acme = old.by_name["acme"]
    acme.begin()
    acme.charge(50)
    changed = (dataclasses.replace(TENANTS[0], requests_per_minute=10), TENANTS[1])
    new = Tenants(changed, old.metrics, previous=old)
    assert new.by_name["acme"] is acme and acme.active == 1 and acme.config.requests_per_minute == 10
    assert acme.tokens is not None and acme.tokens.wait_s(20) > 0  # the tokens bucket carried over
    acme.end()


def test_batch_lines_run_as_their_batchs_tenant(counter: TokenCounter) -> None:
    """A tenant's batch: a line naming a model the tenant may not use is refused at validation,
    the others run under its quotas and are counted as its requests."""

    async def go() -> None:
        (a, _), (b, _) = [await fake_gateway(counter)(served_model_name=name) for name in ("a", "b")]
        tenants = Tenants(TENANTS)
        lines = GatewayLines(Live(Fleet([a, b]), tenants), retries=0)

        def line(i: int, model: str) -> BatchLine:
            body = json.dumps({"model": model, "input": words(3)}).encode()
            return BatchLine(i, f"r{i}", EMBEDDINGS_ROUTE.route, "/v1/embeddings", body)

        BATCH_OWNER.set(tenants.owner_of_key("acme-1"))
        refused = await lines.validate(line(0, "b"))
        assert refused is not None and refused.status == 403 and "may not use model 'b'" in refused.message
        assert await lines.validate(line(1, "a")) is None
        assert (await lines(line(1, "a"))).status == 200
        labels = {"tenant": "acme", "model": "a", "traffic_class": "batch", "status": "200"}
        assert (
            tenants.metrics.registry.get_sample_value("embedserve_gateway_tenant_requests_total", labels) == 1
        )
        BATCH_OWNER.set(TENANT_OWNER + "removed")
        gone = await lines.validate(line(2, "a"))
        assert gone is not None and gone.status == 403 and "no longer served" in gone.message

    asyncio.run(go())


def test_keys_from_a_file_are_read_at_each_load(tmp_path: Path) -> None:
    keys = tmp_path / "acme.keys"
    keys.write_text("k1\nk2, k3\n\n")
    config = parse_tenants({"acme": {"api_keys_file": str(keys)}}, set())[0]
    assert config.api_keys() == ("k1", "k2", "k3")
    keys.write_text("k4\n")  # rotated: the next load (a reload) reads the new one
    assert config.api_keys() == ("k4",)
    keys.unlink()
    with pytest.raises(GatewayConfigError, match=r"api_keys_file: .*acme.keys: cannot be read"):
        config.api_keys()
