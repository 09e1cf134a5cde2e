"""Fair share by tokens at a saturated pool (gateway/pools/fair.py): tenants with work waiting are
served tokens in proportion to their weights whatever their request sizes; online parts never
wait behind batch ones; through the gateway, each request's tenant reaches its parts."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest

from embedserve.gateway.app import create_app
from embedserve.gateway.fleet import Fleet
from embedserve.gateway.live import Live
from embedserve.gateway.pools.counting import TokenCounter
from embedserve.gateway.pools.fair import CURRENT_TENANT, QUEUE_OBSERVER, FairGate
from embedserve.gateway.tenancy.tenant_config import TenantConfig
from embedserve.gateway.tenancy.tenants import Tenants
from tests.helpers.gateway_fakes import LONG, SHORT, SHORT2, fake_gateway
from tests.helpers.server_process import words


async def _client(
    gate: FairGate,
    tenant: tuple[str, float],
    tokens: int,
    s_per_token: float,
    until: float,
    got: Counter[str],
) -> None:
    """A closed loop of `tokens`-token batch parts, each held for its tokens' service time;
    `got`: the tokens granted to each tenant (the order of service is what fairness decides)."""
    CURRENT_TENANT.set(tenant)
    while time.monotonic() < until:
        async with gate.slot(tokens, "batch"):
            if time.monotonic() < until:  # parts still waiting at the end go after the others stop
                got[tenant[0]] += tokens
            await asyncio.sleep(tokens * s_per_token)


def _contend(
    tenants: list[tuple[str, float, int]], capacity: int, s_per_token: float, seconds: float = 1.5
) -> Counter[str]:
    """Tokens served per tenant while every tenant keeps 4 parts of its size waiting."""
    served: Counter[str] = Counter()

    async def go() -> None:
        gate = FairGate(capacity)
        until = time.monotonic() + seconds
        clients = [
            _client(gate, (n, w), t, s_per_token, until, served) for n, w, t in tenants for _ in range(4)
        ]
        await asyncio.gather(*clients)
        assert gate.inflight == 0 and gate.waiting == 0

    asyncio.run(go())
    return served


def test_tenants_weighted_3_to_1_are_served_tokens_3_to_1() -> None:
    served = _contend([("a", 3.0, 50), ("b", 1.0, 50)], capacity=200, s_per_token=5e-4)
    assert 2.4 <= served["a"] / served["b"] <= 3.6, served


def test_shares_are_by_tokens_not_requests() -> None:
    """8K-token documents against 64-token queries, equal weights: equal tokens served (by
    requests, the document tenant would get 128 times the share)."""
    served = _contend(
        [("docs", 1.0, 8192), ("queries", 1.0, 64)], capacity=8192, s_per_token=1e-5, seconds=2.0
    )
    assert 0.8 <= served["docs"] / served["queries"] <= 1.25, served


def test_a_tenant_under_its_share_does_not_wait_behind_a_backlog() -> None:
    async def go() -> None:
        gate = FairGate(100)
        order: list[str] = []

        async def part(tenant: str, tokens: int) -> None:
            CURRENT_TENANT.set((tenant, 1.0))
            async with gate.slot(tokens, "batch"):
                order.append(tenant)
                await asyncio.sleep(0.01)

        backlog = [asyncio.ensure_future(part("big", 100)) for _ in range(6)]
        await asyncio.sleep(0.005)  # the first runs, five wait
        late = asyncio.ensure_future(part("small", 10))
        await asyncio.gather(*backlog, late)
        assert order.index("small") <= 2, order  # next but one, not behind the five

    asyncio.run(go())


def test_online_parts_never_wait_and_hold_batch_back_while_they_run() -> None:
    async def go() -> None:
        gate = FairGate(100)
        async with gate.slot(100, "batch"), gate.slot(50, "online") as waited:  # the allowance is full
            assert waited == 0.0 and gate.inflight == 150
        assert gate.inflight == 0
        async with gate.slot(60, "online"):
            batch = asyncio.ensure_future(_held(gate, 60))
            await asyncio.sleep(0.01)
            assert not batch.done() and gate.waiting == 1  # 60 + 60 > 100: waits for the query
        assert await batch > 0

    asyncio.run(go())


async def _held(gate: FairGate, tokens: int) -> float:
    async with gate.slot(tokens, "batch") as waited:
        return waited


def test_each_part_reports_its_wait_at_the_gate() -> None:
    """What a tenant's queue-time histogram gets (gateway/tenancy/tenants.py sets the observer)."""

    async def go() -> list[float]:
        gate, waits = FairGate(100), []
        QUEUE_OBSERVER.set(waits.append)
        async with gate.slot(100, "batch"), gate.slot(10, "online"):
            batch = asyncio.ensure_future(_held(gate, 50))
            await asyncio.sleep(0.05)
        assert await batch >= 0.04
        return waits

    waits = asyncio.run(go())
    assert len(waits) == 3 and waits[0] < 0.01 and waits[1] == 0.0 and waits[2] >= 0.04  # online: 0


def test_a_cancelled_waiter_gives_way() -> None:
    async def go() -> None:
        gate = FairGate(10)
        async with gate.slot(10, "batch"):
            gone = asyncio.ensure_future(_held(gate, 10))
            nxt = asyncio.ensure_future(_held(gate, 10))
            await asyncio.sleep(0.01)
            gone.cancel()
            await asyncio.sleep(0)
        assert await nxt >= 0 and gate.inflight == 0 and gate.waiting == 0

    asyncio.run(go())


@pytest.fixture(scope="module")
def counter(qwen3_dir: Path) -> TokenCounter:
    return TokenCounter(qwen3_dir)


def test_through_the_gateway_each_requests_tenant_reaches_the_pools_gate(
    counter: TokenCounter, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("A_KEYS", "key-a")
    monkeypatch.setenv("B_KEYS", "key-b")
    tenants = (TenantConfig("a", "A_KEYS", weight=3), TenantConfig("b", "B_KEYS"))
    seen: list[Any] = []

    async def go() -> None:
        pools = {
            "short": {"max_tokens": 64, "upstreams": [SHORT, SHORT2]},
            "long": {"max_tokens": 4096, "upstreams": [LONG], "max_inflight_tokens": 1000},
        }
        service, fakes = await fake_gateway(counter)(pools=pools)
        gate = service.upstreams.pools["long"].gate
        assert gate is not None
        original = gate.slot

        def spy(tokens: int, traffic_class: str) -> Any:
            seen.append((CURRENT_TENANT.get(), tokens, traffic_class))
            return original(tokens, traffic_class)

        gate.slot = spy  # type: ignore[method-assign]
        registry = Tenants(tenants)
        app = create_app(Live.of(Fleet([service]), registry))
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as client:
            for key in ("key-a", "key-b"):
                body = {"input": [words(3), words(300)], "priority": "batch"}
                r = await client.post("/v1/embeddings", json=body, headers={"Authorization": f"Bearer {key}"})
                assert r.status_code == 200, r.text
        assert fakes[LONG].inputs == [[words(3), words(300)]] * 2
        # each tenant's parts at the gate, in its queue-time histogram (the short part skips it)
        queue = {
            s.labels["tenant"]: s.value
            for m in registry.metrics.registry.collect()
            for s in m.samples
            if s.name == "embedserve_gateway_tenant_queue_seconds_count"
            and s.labels["traffic_class"] == "batch"
        }
        assert queue == {"a": 1.0, "b": 1.0}

    asyncio.run(go())
    assert [(t, c) for t, _, c in seen] == [(("a", 3.0), "batch"), (("b", 1.0), "batch")]


def test_a_waiter_that_leaves_gives_its_tenant_its_place_back() -> None:
    async def go() -> None:
        gate = FairGate(10)
        CURRENT_TENANT.set(("a", 1.0))
        async with gate.slot(10, "batch"):
            gone = asyncio.ensure_future(_held(gate, 10))
            await asyncio.sleep(0.01)
            assert gate._finish["a"] == 20  # tagged behind the part running
            gone.cancel()
            await asyncio.sleep(0.01)
            assert gate._finish["a"] == 10 and gate.waiting == 0  # as if it had never come

    asyncio.run(go())


def test_a_reloaded_pool_keeps_its_gate_and_what_is_in_flight_on_it() -> None:
    """A reload (gateway/live.py) builds new pools; one keeping its name keeps its gate, resized:
    parts still in flight count against the new limit (the pool is never sent twice its
    allowance), and a larger limit lets a waiting part go at once."""
    from embedserve.gateway.pools.config import parse_config
    from embedserve.gateway.pools.upstreams import UpstreamSet

    def config(limit: int) -> Any:
        pools = {"long": {"max_tokens": 64, "upstreams": ["http://x:1"], "max_inflight_tokens": limit}}
        return parse_config({"pools": pools, "routes": [{"class": "batch", "order": ["long"]}]})

    async def go() -> None:
        async with httpx.AsyncClient() as client:
            old = UpstreamSet(config(10), client)
            gate = old.pools["long"].gate
            assert gate is not None
            held = asyncio.Event()
            release = asyncio.Event()

            async def running() -> None:
                async with gate.slot(8, "batch"):
                    held.set()
                    await release.wait()

            first = asyncio.create_task(running())
            await held.wait()
            new = UpstreamSet(config(12), client, before=old)
            kept = new.pools["long"].gate
            assert kept is gate and kept.capacity == 10  # until the reload swaps (a refused one: never)
            new.apply_limits()
            assert kept.capacity == 12 and kept.inflight == 8
            waiter = asyncio.create_task(_take(kept, 6))  # 8 + 6 > 12: waits for the old part
            await asyncio.sleep(0.01)
            assert kept.waiting == 1
            UpstreamSet(config(14), client, before=new).apply_limits()  # a larger limit: it goes
            await asyncio.wait_for(waiter, 1)
            release.set()
            await first
            assert kept.inflight == 0
            assert UpstreamSet(config(10), client).pools["long"].gate is not gate  # no `before`: new

    asyncio.run(go())


async def _take(gate: FairGate, tokens: int) -> None:
    async with gate.slot(tokens, "batch"):
        pass


def test_a_refused_reload_leaves_the_running_pools_limit(qwen3_dir: Path, tmp_path: Path) -> None:
    """The new config's pools are built (its gate kept) before a tenant's missing key refuses
    the reload: the running pool keeps its limit; a reload that goes through applies the new one."""
    import yaml

    from embedserve.gateway.fleet_config import load_fleet
    from embedserve.gateway.live import build, reload

    def write(limit: int, tenants: bool) -> Path:
        pools = {
            "long": {"max_tokens": 64, "upstreams": ["http://127.0.0.1:9"], "max_inflight_tokens": limit}
        }
        raw: dict[str, Any] = {
            "model": str(qwen3_dir),
            "pools": pools,
            "routes": [{"class": "batch", "order": ["long"]}],
        }
        if tenants:
            raw["tenants"] = {"t": {"api_keys_env": "EMBEDSERVE_TEST_UNSET_KEYS"}}
        path = tmp_path / f"pools-{limit}.yaml"
        path.write_text(yaml.safe_dump(raw))
        return path

    async def go() -> None:
        async with httpx.AsyncClient() as client:
            built = await build(load_fleet(write(10, False)), lambda m: str(m), client, None)
            gate = built.live.fleet.default.upstreams.pools["long"].gate  # type: ignore[attr-defined]
            kept = await reload(write(20, True), lambda c: c, lambda m: str(m), client, None, built)
            assert kept is built and gate.capacity == 10  # refused: the key variable is not set
            done = await reload(write(30, False), lambda c: c, lambda m: str(m), client, None, built)
            assert done is not built and gate.capacity == 30
            assert done.live.fleet.default.upstreams.pools["long"].gate is gate  # type: ignore[attr-defined]
            for s in done.sets:
                await s.close()

    asyncio.run(go())
