"""pools.yaml's typed reader (gateway/pools/fields.py): each kind's checks and words, keys read
by their declarations, and every parser's sections allowing exactly their declared keys."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest

from embedserve.gateway.pools.config import GatewayConfig, GatewayConfigError, PoolConfig, parse_config
from embedserve.gateway.pools.fields import Key, key, key_names, read_fields, section
from embedserve.gateway.tenancy.tenant_config import TenantConfig, parse_tenants
from embedserve.scale.config import Resources, Scaling

GOOD = [
    ("positive_int", 3, 3),
    ("count", 0, 0),
    ("seconds", 2, 2.0),
    ("weight", 0.5, 0.5),
    ("number", 1.5, 1.5),
    ("non_negative", 0, 0.0),
    ("text", "x", "x"),
]
BAD = [
    ("positive_int", 0, "w: expected a positive integer, got 0"),
    ("positive_int", True, "w: expected a positive integer, got True"),
    ("positive_int", 2.0, "w: expected a positive integer, got 2.0"),
    ("count", -1, "w: expected a positive integer, got -1"),
    ("seconds", 0, "w: expected a positive number of seconds, got 0"),
    ("seconds", math.inf, "w: expected a positive number of seconds, got inf"),
    ("weight", "2", "w: expected a positive number, got '2'"),
    ("number", math.nan, "w: expected a number, got nan"),
    ("number", 0, "w: expected a positive number"),
    ("non_negative", -0.5, "w: expected a non-negative number"),
    ("text", "", "w: expected a non-empty string, got ''"),
    ("text", None, "w: expected a non-empty string, got None"),
]


@pytest.mark.parametrize(("kind", "value", "read"), GOOD)
def test_each_kind_reads_its_values(kind: str, value: object, read: object) -> None:
    got = Key(kind).read(value, "w")
    assert got == read and type(got) is type(read)


@pytest.mark.parametrize(("kind", "value", "message"), BAD)
def test_each_kind_refuses_in_its_words(kind: str, value: object, message: str) -> None:
    with pytest.raises(GatewayConfigError) as e:
        Key(kind).read(value, "w")
    assert str(e.value) == message


def test_choices_optional_values_and_yaml_names() -> None:
    assert Key("choice", choices=("a", "b")).read("b", "w") == "b"
    with pytest.raises(GatewayConfigError, match=r"^w: expected one of \['a', 'b'\], got 'c'$"):
        Key("choice", choices=("a", "b")).read("c", "w")
    assert Key("positive_int", optional=True).read(None, "w") is None

    @dataclass(frozen=True)
    class Section:
        low: int = key(1, "count", name="min")
        rate: float = key(2.0, "number")
        other: str = "not a key"

    assert key_names(Section) == {"min", "rate"}
    assert read_fields(Section, {"min": 0}, "s") == {"low": 0}  # absent keys keep their defaults
    with pytest.raises(GatewayConfigError, match=r"^s\.rate: expected a positive number$"):
        read_fields(Section, {"rate": -1}, "s")
    with pytest.raises(GatewayConfigError, match=r"^rate: expected a number, got 'x'$"):
        read_fields(Section, {"rate": "x"}, "")  # the top level: the key alone
    with pytest.raises(GatewayConfigError, match=r"unknown keys \['mni'\]; allowed: \['min', 'rate'\]"):
        section({"mni": 1}, "s", key_names(Section))


def test_every_parser_allows_exactly_its_declared_keys() -> None:
    base = {
        "pools": {"p": {"max_tokens": 8, "upstreams": ["http://h:1"]}},
        "routes": [{"class": "online", "order": ["p"]}],
    }
    with pytest.raises(GatewayConfigError) as e:
        parse_config({**base, "timeout": 3})
    allowed = {"pools", "routes", *key_names(GatewayConfig)}
    assert f"allowed: {sorted(allowed)}" in str(e.value)
    assert {"timeout_s", "request_timeout_s", "max_body_bytes", "api_keys_env"} <= allowed
    assert key_names(PoolConfig) == {"max_inflight_tokens"}
    # a declared key is read with no parser code of its own
    cfg = parse_config({**base, "health_interval_s": 0.5, "balance": "round_robin"})
    assert (cfg.health_interval_s, cfg.balance) == (0.5, "round_robin")
    (tenant,) = parse_tenants({"t": {"api_keys_env": "K", "weight": 2, "tokens_per_minute": 10}}, set())
    assert (tenant.weight, tenant.tokens_per_minute, tenant.requests_per_minute) == (2.0, 10, None)
    assert key_names(TenantConfig) == {
        "tokens_per_minute",
        "requests_per_minute",
        "max_concurrent_requests",
        "weight",
    }
    assert key_names(Scaling) >= {"min", "max", "target_queued_tokens"} and key_names(Resources) == {
        "num_cpus",
        "num_gpus",
    }
