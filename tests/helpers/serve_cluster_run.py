"""End-to-end run of `serve-cluster` on a local Ray (run inside a loopback-only network namespace
by tests/integration/test_serve_cluster.py): correctness, a killed replica, `/v2/embed` and the
caller's X-Request-Timeout, the ingress's overhead next to a direct `embedserve serve`, the short
pool scaled 1 -> 2 -> 1 on queued tokens; then the app redeployed on a cross-encoder for
`/v1/rerank`.

    python -m tests.helpers.serve_cluster_run MODEL_DIR RERANKER_DIR OUT.json
"""

from __future__ import annotations

import asyncio
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import ray
from openai import AsyncOpenAI
from ray import serve

from embedserve import Engine
from embedserve.scale.app import APP_NAME, build_app
from embedserve.scale.config import parse_scale_config
from tests.helpers.server_process import free_port, words

SHORT_MAX, LONG_MAX = 64, 2048


def pools_yaml(model: str) -> dict[str, Any]:
    quick = {"metrics_interval_s": 0.5, "look_back_period_s": 1.0}
    return {
        "model": model,
        "health_interval_s": 0.5,
        "pools": {
            "short": {
                "max_tokens": SHORT_MAX,
                "max_num_batched_tokens": 256,
                "warmup_lengths": [16],
                "replicas": {"min": 1, "max": 2, "target_queued_tokens": 64, "upscale_delay_s": 1,
                             "downscale_delay_s": 3, **quick},
                "resources": {"num_cpus": 0.5},
            },
            "long": {
                "max_tokens": LONG_MAX,
                "max_num_batched_tokens": 512,
                "warmup_lengths": [16],
                "replicas": {"min": 1, "max": 1, **quick},
                "resources": {"num_cpus": 0.5},
            },
        },
        "routes": [{"class": "online", "order": ["short", "long"]}, {"class": "batch", "order": ["long"]}],
    }  # fmt: skip


def rerank_pools_yaml(model: str) -> dict[str, Any]:
    one = {"replicas": {"min": 1, "max": 1}, "resources": {"num_cpus": 0.5}, "warmup_lengths": [16]}
    return {
        "model": model,
        "health_interval_s": 0.5,
        "pools": {"short": {"max_tokens": 32, **one}, "long": {"max_tokens": 128, **one}},
        "routes": [{"class": "online", "order": ["short", "long"]}],
    }


def short_replicas() -> int:
    app = serve.status().applications[APP_NAME]
    return int(app.deployments["pool-short"].replica_states.get("RUNNING", 0))


def kill_one_short_replica() -> str:
    names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if "pool-short" in a["name"]]
    ray.kill(ray.get_actor(names[0], namespace="serve"), no_restart=True)
    return str(names[0])


async def correctness(base: str, model: str) -> dict[str, Any]:
    """40 mixed requests (some with several inputs), a short replica killed after the 10th answer."""
    lengths = [5, 40, 300, 12, 1500, 30, 800, 8, 50, 200] * 4
    requests = [
        [words(n, seed=i)] if i % 3 else [words(n, seed=i), words(7, seed=i)] for i, n in enumerate(lengths)
    ]
    client = AsyncOpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
    done = 0
    killed: str | None = None
    sem = asyncio.Semaphore(4)

    async def one(inputs: list[str]) -> list[list[float]]:
        nonlocal done, killed
        async with sem:
            r = await client.embeddings.create(model=Path(model).name, input=inputs)
        done += 1
        if done == 10 and killed is None:
            killed = await asyncio.to_thread(kill_one_short_replica)
        return [d.embedding for d in r.data]

    got = await asyncio.gather(*(one(inputs) for inputs in requests))
    flat = [t for inputs in requests for t in inputs]
    with Engine.from_pretrained(model, max_model_len=LONG_MAX) as engine:
        want = engine.embed(flat)
    diff = float(np.max(np.abs(np.asarray([v for vs in got for v in vs]) - np.asarray(want))))
    return {"requests": len(requests), "inputs": len(flat), "max_abs_diff": diff, "killed": killed}


def cohere_and_deadline(base: str, model: str) -> dict[str, Any]:
    """/v2/embed split per text (the short text on the short pool, the long one on the long)
    equals the engine's vectors in order; a caller's X-Request-Timeout that has passed is 504
    deadline_exceeded; /v1/rerank on an embedding model is the server's 400."""
    texts = [words(5, seed=1), words(300, seed=2)]
    body = {"texts": texts, "input_type": "search_query", "embedding_types": ["float", "base64"]}
    with httpx.Client(timeout=60) as c:
        r = c.post(f"{base}/v2/embed", json=body)
        r.raise_for_status()
        late = c.post(f"{base}/v2/embed", json=body, headers={"X-Request-Timeout": "0.001"})
        rerank = c.post(f"{base}/v1/rerank", json={"query": "q", "documents": ["d"]})
    with Engine.from_pretrained(model, max_model_len=LONG_MAX) as engine:
        want = engine.embed(texts, prompt_name="query")
    got = r.json()
    return {
        "pools": r.headers.get("x-embedserve-pools"),
        "types": sorted(got["embeddings"]),
        "max_abs_diff": float(np.max(np.abs(np.asarray(got["embeddings"]["float"]) - want))),
        "late": [late.status_code, late.json()["error"]["type"]],
        "rerank_on_embedder": [rerank.status_code, rerank.json()["error"]["message"]],
    }


def rerank(base: str, model: str) -> dict[str, Any]:
    """The app redeployed on a reranker: /v1/rerank (and /rerank) equal the engine's ranking."""
    serve.delete(APP_NAME)
    serve.run(build_app(parse_scale_config(rerank_pools_yaml(model))), name=APP_NAME, route_prefix="/")
    wait_ready(base)
    query, docs = "how do wings produce lift", ["lift", "boundary layers", words(60, seed=3), "nozzles"]
    with Engine.from_pretrained(model, max_model_len=128) as engine:
        want = [(x.index, x.relevance_score) for x in engine.rerank(query, docs, top_n=3)]
    out: dict[str, Any] = {}
    with httpx.Client(timeout=60) as c:
        for path in ("/v1/rerank", "/rerank"):
            r = c.post(f"{base}{path}", json={"query": query, "documents": docs, "top_n": 3})
            r.raise_for_status()
            got = [(x["index"], x["relevance_score"]) for x in r.json()["results"]]
            out[path] = {
                "pools": r.headers.get("x-embedserve-pools"),
                "same_order": [i for i, _ in got] == [i for i, _ in want],
                "max_abs_diff": max(abs(a[1] - b[1]) for a, b in zip(got, want, strict=True)),
            }
    return out


def pool_labels(metrics: str) -> list[str]:
    """The `pool` labels of the replicas' request-latency counts on the ingress's /metrics."""
    counts = [x for x in metrics.splitlines() if x.startswith("embedserve_request_latency_seconds_count{")]
    return sorted({x.split('pool="')[1].split('"')[0] for x in counts})


def wait_ready(base: str) -> None:
    for _ in range(240):
        if httpx.get(f"{base}/health/ready").status_code == 200:
            return
        time.sleep(0.5)


def latency(url: str, n: int = 60) -> float:
    with httpx.Client(timeout=30) as c:
        c.post(url, json={"input": [words(10)]}).raise_for_status()
        times = []
        for i in range(n):
            t = time.perf_counter()
            c.post(url, json={"input": [words(10, seed=i)]}).raise_for_status()
            times.append(time.perf_counter() - t)
    return statistics.median(times) * 1000


def overhead(base: str, model: str) -> dict[str, float]:
    port = free_port()
    options = ["--max-model-len", str(SHORT_MAX), "--max-num-batched-tokens", "256", "--warmup-lengths", "16"]
    cmd = [sys.executable, "-m", "embedserve", "serve", "--model", model, "--port", str(port), *options]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        direct = f"http://127.0.0.1:{port}"
        for _ in range(240):
            try:
                if httpx.get(f"{direct}/health/ready").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        return {
            "direct_p50_ms": latency(f"{direct}/v1/embeddings"),
            "ingress_p50_ms": latency(f"{base}/v1/embeddings"),
        }
    finally:
        proc.terminate()
        proc.wait(30)


def scale(base: str) -> list[tuple[float, int, str]]:
    """Sustained short-input load until the short pool runs 2 replicas, then idle until 1."""
    trace: list[tuple[float, int, str]] = []
    start = time.monotonic()
    stop = False

    async def load() -> None:
        async with httpx.AsyncClient(timeout=60) as c:

            async def worker(k: int) -> None:
                while not stop:
                    await c.post(f"{base}/v1/embeddings", json={"input": [words(40, seed=k)] * 4})

            await asyncio.gather(*(worker(k) for k in range(12)))

    def watch(phase: str, until: int, limit_s: float) -> None:
        end = time.monotonic() + limit_s
        while time.monotonic() < end:
            n = short_replicas()
            trace.append((round(time.monotonic() - start, 1), n, phase))
            if n == until:
                return
            time.sleep(0.5)

    async def loaded() -> None:
        nonlocal stop
        task = asyncio.create_task(load())
        await asyncio.to_thread(watch, "load", 2, 90)
        stop = True
        await task

    asyncio.run(loaded())
    watch("idle", 1, 90)
    return trace


def main(model: str, reranker: str, out: str) -> None:
    ray.init(num_cpus=2, include_dashboard=False)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        t = time.monotonic()
        serve.run(build_app(parse_scale_config(pools_yaml(model))), name=APP_NAME, route_prefix="/")
        wait_ready(base)
        result: dict[str, Any] = {"startup_s": round(time.monotonic() - t, 1)}
        result["correctness"] = asyncio.run(correctness(base, model))
        result["cohere"] = cohere_and_deadline(base, model)
        time.sleep(3)  # the killed replica's replacement comes up
        result["overhead"] = overhead(base, model)
        result["scale_trace"] = scale(base)
        result["metrics_pool_labels"] = pool_labels(httpx.get(f"{base}/metrics").text)
        t = time.monotonic()
        result["rerank"] = rerank(base, reranker)
        result["rerank_s"] = round(time.monotonic() - t, 1)
        Path(out).write_text(json.dumps(result, indent=1))
    finally:
        serve.shutdown()
        ray.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3])
