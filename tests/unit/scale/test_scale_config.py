"""pools.yaml with model pools: the gateway's validation plus the serving keys (no Ray)."""

from __future__ import annotations

from typing import Any

import pytest

from embedserve.gateway.pools.config import GatewayConfigError
from embedserve.scale.config import parse_scale_config


def _raw(**short: Any) -> dict[str, Any]:
    return {
        "model": "/models/m",
        "pools": {
            "short": {"max_tokens": 64, "max_num_batched_tokens": 128, **short},
            "long": {"max_tokens": 4096, "dtype": "bfloat16", "replicas": {"min": 1, "max": 3}},
        },
        "routes": [{"class": "online", "order": ["short", "long"]}, {"class": "batch", "order": ["long"]}],
    }


def test_pools_become_deployments_with_engine_options_and_scaling() -> None:
    cfg = parse_scale_config(
        _raw(replicas={"min": 1, "max": 2, "target_queued_tokens": 500, "upscale_delay_s": 0})
    )
    short, long = cfg.pools
    assert short.deployment == "pool-short" and short.model == "/models/m"
    assert short.engine.changed() == {"max_num_batched_tokens": 128, "max_model_len": 64}
    assert (short.scaling.min_replicas, short.scaling.max_replicas) == (1, 2)
    assert short.scaling.target_queued_tokens == 500 and short.scaling.upscale_delay_s == 0
    assert long.engine.changed() == {"dtype": "bfloat16", "max_model_len": 4096}
    # The gateway's config is what routing reads: limits, routes, one "upstream" per deployment.
    assert cfg.gateway.limits() == {"short": 64, "long": 4096}
    assert cfg.gateway.pool("long").upstreams == ("serve:pool-long",)
    assert cfg.gateway.route("batch") is not None and cfg.gateway.model == "/models/m"


@pytest.mark.parametrize(
    ("short", "message"),
    [
        ({"upstreams": ["http://h:1"]}, "not 'upstreams:'"),
        ({"max_model_len": 32}, "below max_tokens"),
        ({"replicas": {"min": 3, "max": 2}}, "below min"),
        ({"replicas": {"maximum": 2}}, "unknown keys"),
        ({"model": "/models/other"}, "different models"),
        ({"max_tokens": 0}, "max_tokens"),  # the gateway's own check
        ({"classes": ["nightly"]}, "classes"),
        ({"resources": {"num_gpus": -1}}, "num_gpus"),
    ],
)
def test_errors_name_the_key(short: dict[str, Any], message: str) -> None:
    with pytest.raises(GatewayConfigError, match=message):
        parse_scale_config(_raw(**short))


def test_the_single_machine_cli_does_not_import_ray() -> None:
    import subprocess
    import sys

    code = "import sys, embedserve, embedserve.cli; assert 'ray' not in sys.modules, 'ray imported'"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True).returncode == 0
