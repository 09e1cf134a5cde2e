"""The gateway examples shipped in deploy/ load, and route as their comments say."""

from __future__ import annotations

from pathlib import Path

import pytest

from embedserve.gateway.fleet_config import load_fleet
from embedserve.gateway.pools.config import GatewayConfig, load_config
from embedserve.gateway.pools.routing import place_inputs

DEPLOY = Path(__file__).resolve().parents[3] / "deploy"


def _route(config: GatewayConfig, traffic_class: str, tokens: list[int]) -> list[str]:
    route = next(r for r in config.routes if r.traffic_class == traffic_class)
    limits = {p.name: p.max_tokens for p in config.pools}
    return [p.candidates[0] for p in place_inputs(tokens, route, limits, set(limits), "error")]


def test_local_example_routes_queries_short_and_indexing_long() -> None:
    config = load_config(DEPLOY / "pools.yaml")
    assert config.model == "all-MiniLM-L6-v2"  # the default model: runs on any machine
    assert {p.name: p.upstreams for p in config.pools} == {
        "short": ("http://127.0.0.1:8001",),
        "long": ("http://127.0.0.1:8002",),
    }
    assert _route(config, "online", [12, 64, 65, 256]) == ["short", "short", "long", "long"]
    assert _route(config, "batch", [12, 256]) == ["long", "long"]


@pytest.mark.parametrize("name", ["k8s/base/gateway-pools.yaml"])
def test_kubernetes_example_loads(name: str) -> None:
    config = load_config(DEPLOY / name)
    assert _route(config, "online", [20, 5000]) == ["short", "long"]


def test_two_model_example_serves_both_and_the_alias_means_the_new_one() -> None:
    fleet = load_fleet(DEPLOY / "pools.models.yaml")
    assert [m.served_model_name for m in fleet.models] == ["minilm-v1", "minilm-v2"]
    assert fleet.aliases == {"embed-latest": "minilm-v2"}
    old, new = fleet.models
    assert _route(old, "online", [12, 256]) == ["all", "all"]
    assert _route(new, "online", [12, 65]) == ["short", "long"] and _route(new, "batch", [12]) == ["long"]
    assert all(m.model == "all-MiniLM-L6-v2" and m.timeout_s == 600 for m in fleet.models)
    search, indexer = fleet.tenants
    assert (search.name, search.classes, search.models, search.weight) == ("search", {"online"}, None, 3)
    assert (indexer.classes, indexer.models) == ({"batch"}, {"minilm-v2", "embed-latest"})
