"""End-to-end run of `serve-cluster` with two models, an alias and three tenants on a local Ray (run
inside a loopback-only network namespace by tests/integration/test_serve_cluster.py): each
model's vectors by name and alias, through the official `openai` client with a tenant's key;
`/v1/models`; 401 / 403 / 404 / 429 + Retry-After; one tenant over its quota while the other is
answered; the replicas' metrics labelled MODEL/POOL; batch parts shared at a pool's
`max_inflight_tokens` by the tenants' weights.

    python -m tests.helpers.serve_cluster_models_run MODEL_A MODEL_B OUT.json
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import ray
from openai import OpenAI
from ray import serve

from embedserve import Engine
from embedserve.scale.app import APP_NAME, build_app
from embedserve.scale.cluster_config import parse_cluster_config
from tests.helpers.serve_cluster_run import pool_labels
from tests.helpers.server_process import free_port, words

KEYS = {"HEAVY_KEYS": "heavy-1", "LIGHT_KEYS": "light-1", "BULK_KEYS": "bulk-1"}


def cluster_yaml(a: str, b: str) -> dict[str, Any]:
    one = {"replicas": {"min": 1, "max": 1}, "resources": {"num_cpus": 0.25}, "warmup_lengths": [16]}

    def entry(model: str) -> dict[str, Any]:
        pools = {
            "short": {"max_tokens": 32, **one},
            "long": {"max_tokens": 256, "max_inflight_tokens": 64, **one},
        }
        routes = [{"class": "online", "order": ["short", "long"]}, {"class": "batch", "order": ["long"]}]
        return {"model": model, "pools": pools, "routes": routes}

    return {
        "health_interval_s": 0.5,
        "models": {"qwen": entry(a), "llama": entry(b)},
        "aliases": {"latest": "llama"},
        "tenants": {
            "heavy": {"api_keys_env": "HEAVY_KEYS", "weight": 3},
            "light": {"api_keys_env": "LIGHT_KEYS", "models": ["qwen"], "requests_per_minute": 30},
            "bulk": {"api_keys_env": "BULK_KEYS", "models": ["qwen"], "classes": ["batch"]},
        },
    }


def wait_ready(base: str, limit_s: float = 240) -> None:
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        try:
            if httpx.get(f"{base}/health/ready", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise TimeoutError("serve-cluster did not become ready")


def vectors(base: str, a: str, b: str) -> dict[str, Any]:
    texts = [words(5, seed=1), words(120, seed=2), words(9, seed=3)]
    client = OpenAI(base_url=f"{base}/v1", api_key="heavy-1", max_retries=0)
    out: dict[str, Any] = {}
    for name, model in (("qwen", a), ("llama", b), ("latest", b)):
        raw = client.embeddings.with_raw_response.create(model=name, input=texts)
        r = raw.parse()
        with Engine.from_pretrained(model, max_model_len=256) as engine:
            want = engine.embed(texts)
        diff = float(np.max(np.abs(np.asarray([d.embedding for d in r.data]) - np.asarray(want))))
        out[name] = {"model": r.model, "max_abs_diff": diff, "pools": raw.headers.get("x-embedserve-pools")}
    listed = httpx.get(f"{base}/v1/models", headers={"Authorization": "Bearer heavy-1"}).json()["data"]
    out["listed"] = {m["id"]: m["aliases"] for m in listed}
    return out


def refusals(base: str) -> dict[str, Any]:
    def post(key: str | None, model: str) -> httpx.Response:
        headers = {} if key is None else {"Authorization": f"Bearer {key}"}
        return httpx.post(
            f"{base}/v1/embeddings", json={"model": model, "input": ["x"]}, headers=headers, timeout=60
        )

    out: dict[str, Any] = {
        "no_key": post(None, "qwen").status_code,
        "unknown_key": post("nope", "qwen").status_code,
        "forbidden": [post("light-1", "latest").status_code, post("light-1", "llama").status_code],
        "unknown_model": post("light-1", "gpt").json()["error"]["message"],
    }
    statuses, retry_after = [], None
    for _ in range(40):  # 30 a minute: the bucket runs dry
        r = post("light-1", "qwen")
        statuses.append(r.status_code)
        if r.status_code == 429:
            retry_after = r.headers.get("Retry-After")
            break
    out["quota"] = {
        "statuses": statuses,
        "retry_after": retry_after,
        "other": post("heavy-1", "qwen").status_code,
    }
    return out


def fair_share(base: str) -> dict[str, Any]:
    """Tenants heavy (weight 3) and bulk (weight 1) flood the qwen long pool with batch parts (64
    tokens in flight at most) for a fixed time; tokens answered per tenant."""
    served = {"heavy": 0, "bulk": 0}
    stop = time.monotonic() + 20

    async def flood() -> None:
        async with httpx.AsyncClient(timeout=120) as c:

            async def worker(tenant: str, k: int) -> None:
                headers = {"Authorization": f"Bearer {tenant}-1"}
                while time.monotonic() < stop:
                    body = {"model": "qwen", "input": [words(30, seed=k)], "priority": "batch"}
                    r = await c.post(f"{base}/v1/embeddings", json=body, headers=headers)
                    if r.status_code == 200 and time.monotonic() < stop:
                        served[tenant] += int(r.json()["usage"]["total_tokens"])

            await asyncio.gather(*(worker(t, k) for t in ("heavy", "bulk") for k in range(6)))

    asyncio.run(flood())
    return {"served_tokens": served, "ratio": served["heavy"] / max(1, served["bulk"])}


def main(a: str, b: str, out: str) -> None:
    os.environ.update(KEYS)  # before Ray starts: its workers (the ingress) inherit them
    ray.init(num_cpus=2, include_dashboard=False)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        t = time.monotonic()
        serve.run(build_app(parse_cluster_config(cluster_yaml(a, b))), name=APP_NAME, route_prefix="/")
        wait_ready(base)
        result: dict[str, Any] = {"startup_s": round(time.monotonic() - t, 1)}
        result["deployments"] = sorted(serve.status().applications[APP_NAME].deployments)
        result["vectors"] = vectors(base, a, b)
        result["refusals"] = refusals(base)
        time.sleep(3)  # the replicas push their metrics every 2 s
        metrics = httpx.get(f"{base}/metrics", headers={"Authorization": "Bearer heavy-1"})
        result["metrics_status"] = metrics.status_code
        result["fair"] = fair_share(base)
        result["metrics_pool_labels"] = pool_labels(metrics.text)
        Path(out).write_text(json.dumps(result, indent=1))
    finally:
        serve.shutdown()
        ray.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3])
