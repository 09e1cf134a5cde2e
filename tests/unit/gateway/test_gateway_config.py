"""pools.yaml validation and the schema guard's pure decisions."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from embedserve.cli import main
from embedserve.gateway.pools.config import GatewayConfigError, load_config, parse_config
from embedserve.gateway.pools.guard import UpstreamReport, choose_schema, exclusion, startup_conflict

EXAMPLE: dict[str, Any] = {
    "pools": {
        "short": {"max_tokens": 4096, "upstreams": ["http://127.0.0.1:8001"], "classes": ["online", "batch"]},
        "long": {
            "max_tokens": 16384,
            "upstreams": ["http://127.0.0.1:8002/v1/"],
            "classes": ["online", "batch"],
        },
        "batch-long": {"max_tokens": 16384, "upstreams": ["http://127.0.0.1:8003"], "classes": ["batch"]},
    },
    "routes": [
        {"class": "online", "order": ["short", "long"]},
        {"class": "batch", "order": ["batch-long", "long"]},
    ],
}


def test_example_config_parses(tmp_path: Path) -> None:
    f = tmp_path / "pools.yaml"
    f.write_text(
        "model: /models/m\nhealth_interval_s: 0.5\npools:\n"
        "  short: {max_tokens: 4096, upstreams: ['http://127.0.0.1:8001'], classes: [online, batch]}\n"
        "  long: {max_tokens: 16384, upstreams: ['http://127.0.0.1:8002'], schema: es1-abc}\n"
        "routes:\n  - {class: online, order: [short, long]}\n  - {class: batch, order: [long]}\n"
    )
    cfg = load_config(f)
    assert cfg.model == "/models/m" and cfg.health_interval_s == 0.5 and cfg.balance == "least_tokens"
    assert cfg.limits() == {"short": 4096, "long": 16384}
    assert cfg.pool("long").classes == frozenset({"online", "batch"})  # default: both classes
    assert cfg.pool("long").schema == "es1-abc"
    assert cfg.route("batch") is not None and cfg.route("batch").order == ("long",)  # type: ignore[union-attr]


def test_upstream_urls_are_normalized() -> None:
    cfg = parse_config(EXAMPLE)
    assert cfg.pool("long").upstreams == ("http://127.0.0.1:8002",)


def _edit(path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    raw = copy.deepcopy(EXAMPLE)
    node = raw
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return raw


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (("pools", "short", "max_token"), 4096, r"pools.short: unknown keys \['max_token'\]"),
        (("pools", "short", "max_tokens"), 0, "pools.short.max_tokens: expected a positive integer, got 0"),
        (("pools", "short", "max_tokens"), "4K", "pools.short.max_tokens: expected a positive integer"),
        (("pools", "short", "upstreams"), [], "pools.short.upstreams: expected a non-empty list"),
        (
            ("pools", "short", "upstreams"),
            ["127.0.0.1:8001"],
            r"pools.short.upstreams\[0\]: expected http://",
        ),
        (("pools", "short", "upstreams"), ["http://a:1", "http://a:1/"], "http://a:1 is listed twice"),
        (("pools", "short", "classes"), ["interactive"], r"pools.short.classes: expected one of \['online'"),
        (("routes", 0, "order"), ["short", "medium"], r"routes\[0\].order: unknown pool 'medium'"),
        (("routes", 0, "order"), ["short", "short"], "pool 'short' is listed twice"),
        (("routes", 0, "order"), ["batch-long"], "pool 'batch-long' does not accept class 'online'"),
        (("routes", 1), {"class": "online", "order": ["long"]}, "class 'online' has two routes"),
        (("routes", 1, "order"), ["long"], r"pools \['batch-long'\] appear in no route"),
        (("balance",), "random", r"balance: expected one of \['least_tokens', 'round_robin'\]"),
        (("health_interval_s",), -1, "health_interval_s: expected a positive number"),
        (("routes",), [], "routes: expected a non-empty list"),
    ],
)
def test_bad_configs_name_the_key(path: tuple[Any, ...], value: Any, message: str) -> None:
    with pytest.raises(GatewayConfigError, match=message):
        parse_config(_edit(path, value))


def test_unreadable_or_invalid_yaml_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(GatewayConfigError, match="cannot read gateway config"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("pools: [unclosed")
    with pytest.raises(GatewayConfigError, match=r"bad\.yaml is not valid YAML"):
        load_config(bad)
    bad.write_text("pools: {}\n")
    with pytest.raises(GatewayConfigError, match="needs both 'pools' and 'routes'"):
        load_config(bad)


def _report(schema: str, max_model_len: int = 32768) -> UpstreamReport:
    return UpstreamReport(ready=True, schema=schema, max_model_len=max_model_len)


def test_startup_refuses_pools_with_different_schemas() -> None:
    pools = parse_config(EXAMPLE).pools
    same = {"http://127.0.0.1:8001": _report("es1-a"), "http://127.0.0.1:8002": _report("es1-a")}
    assert startup_conflict(pools, same) is None  # batch-long not known yet: nothing to compare
    mixed = {**same, "http://127.0.0.1:8003": _report("es1-b")}
    message = startup_conflict(pools, mixed)
    assert message is not None and "batch-long=es1-b" in message and "short=es1-a" in message


def test_a_pin_defines_the_pool_schema_before_any_upstream_answers() -> None:
    raw = _edit(("pools", "long", "schema"), "es1-pinned")
    pools = parse_config(raw).pools
    reports = {"http://127.0.0.1:8001": _report("es1-a")}
    assert startup_conflict(pools, reports) is not None
    assert choose_schema(pools, {}) == "es1-pinned"
    assert choose_schema(parse_config(EXAMPLE).pools, {}) is None


def test_exclusion_reasons() -> None:
    pool = parse_config(EXAMPLE).pool("short")
    assert exclusion(pool, "es1-a", _report("es1-a")) is None
    assert exclusion(pool, None, _report("es1-a")) is None  # nothing known yet: the first one defines
    mismatch = exclusion(pool, "es1-a", _report("es1-b"))
    assert mismatch is not None and mismatch.startswith("SCHEMA MISMATCH") and "es1-b" in mismatch
    too_short = exclusion(pool, "es1-a", _report("es1-a", max_model_len=2048))
    assert too_short is not None and "max_model_len 2048 is below" in too_short
    assert exclusion(pool, "es1-a", UpstreamReport(ready=False, error="boom")) == "boom"
    assert (
        exclusion(pool, "es1-a", UpstreamReport(ready=True)) == "reported no embedding_schema in /v1/models"
    )


def test_cli_exits_2_naming_the_problem(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "pools.yaml"
    f.write_text("pools: {short: {max_tokens: 0, upstreams: ['http://127.0.0.1:1']}}\nroutes: []\n")
    assert main(["gateway", "--config", str(f)]) == 2
    assert "pools.short.max_tokens: expected a positive integer, got 0" in capsys.readouterr().err
    f.write_text(yaml.safe_dump(EXAMPLE))
    assert main(["gateway", "--config", str(f)]) == 2
    assert "no model to count tokens with: pass --model or set 'model:'" in capsys.readouterr().err
    assert main(["gateway", "--config", str(f), "--model", str(tmp_path / "nowhere")]) == 2
    assert "nowhere" in capsys.readouterr().err
