"""`serve-cluster` on a local Ray (2 CPUs): two pools of a tiny model behind the ingress.

Slow (about 2 minutes on 2 cores): run with
    pytest -m slow tests/integration/test_serve_cluster.py
Like test_index_ray.py, Ray runs inside a private network namespace with only loopback
(`unshare --net`, root), because its services bind every interface.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.tiny_rerankers import build_cross_encoder
from tests.integration.test_index_ray import _isolated_network

ROOT = Path(__file__).resolve().parents[2]


def _skip_reason() -> str | None:
    reason = _isolated_network()
    if reason is None:
        try:
            import ray.serve  # noqa: F401
        except ImportError:
            return "ray[serve] is not installed (pip install -e '.[scale]')"
    return reason


@pytest.mark.slow
@pytest.mark.skipif(_skip_reason() is not None, reason=str(_skip_reason()))
def test_pools_on_ray_serve_route_survive_a_kill_and_scale(qwen3_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "run.json"
    reranker = build_cross_encoder(tmp_path / "bert-ce", "bert")
    result = _run_isolated("tests.helpers.serve_cluster_run", [qwen3_dir, reranker], out)
    print(json.dumps(result))  # the scale trace and overhead numbers, for the record (-s)

    # 40 mixed requests equal the in-process engine's vectors, in order, though a replica died.
    c = result["correctness"]
    assert c["requests"] == 40 and c["killed"] and c["max_abs_diff"] < 2e-5
    # The short pool went 1 -> 2 replicas under queued tokens and back to 1 when idle.
    counts = [n for _, n, _ in result["scale_trace"]]
    assert counts[0] == 1 and 2 in counts and counts[-1] == 1
    # The servers' per-length-bucket metrics reach the ingress, labelled by pool.
    assert result["metrics_pool_labels"] == ["long", "short"]
    # /v2/embed split per text by token count, the engine's vectors; a passed deadline
    # is 504; rerank on an embedding model is the server's 400.
    co = result["cohere"]
    assert co["pools"] == "short,long" and co["types"] == ["base64", "float"] and co["max_abs_diff"] < 2e-5
    assert co["late"] == [504, "deadline_exceeded"]
    assert co["rerank_on_embedder"][0] == 400 and "is an embedding model" in co["rerank_on_embedder"][1]
    # The app redeployed on a cross-encoder: /v1/rerank and /rerank rank as the engine does.
    for path in ("/v1/rerank", "/rerank"):
        rr = result["rerank"][path]
        assert rr["pools"] == "long" and rr["same_order"] and rr["max_abs_diff"] < 1e-5, rr


@pytest.mark.slow
@pytest.mark.skipif(_skip_reason() is not None, reason=str(_skip_reason()))
def test_models_aliases_and_tenants_on_ray_serve(qwen3_dir: Path, llama_dir: Path, tmp_path: Path) -> None:
    """#46 on a real Ray: two models (each two pools: four deployments), an alias, three tenants."""
    out = tmp_path / "run.json"
    result = _run_isolated("tests.helpers.serve_cluster_models_run", [qwen3_dir, llama_dir], out)
    print(json.dumps(result))  # the fair-share numbers, for the record (-s)
    assert result["deployments"] == sorted(
        ["ingress", "metrics-hub", "pool-qwen-short", "pool-qwen-long", "pool-llama-short", "pool-llama-long"]
    )
    v = result["vectors"]
    for name, served in (("qwen", "qwen"), ("llama", "llama"), ("latest", "llama")):
        assert v[name]["model"] == served and v[name]["max_abs_diff"] < 2e-5, v[name]
        assert v[name]["pools"] == "short,long"
    assert v["listed"] == {"qwen": [], "llama": ["latest"]}
    r = result["refusals"]
    assert r["no_key"] == 401 and r["unknown_key"] == 401 and r["forbidden"] == [403, 403]
    assert "'qwen'" in r["unknown_model"] and "llama" not in r["unknown_model"]
    q = r["quota"]
    assert q["statuses"][-1] == 429 and set(q["statuses"][:-1]) == {200} and int(q["retry_after"]) >= 1
    assert q["other"] == 200
    assert result["metrics_status"] == 200
    assert result["metrics_pool_labels"] == ["llama/long", "llama/short", "qwen/long", "qwen/short"]
    # weights 3:1 at the qwen long pool's allowance, both tenants flooding: 3:1 +- 25 %
    assert 2.25 < result["fair"]["ratio"] < 3.75, result["fair"]


def _run_isolated(module: str, args: list[Path], out: Path) -> dict[str, Any]:
    """`python -m module ARGS OUT` in a loopback-only network namespace; its JSON result."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
        "OMP_NUM_THREADS": "1",
        "RAY_USAGE_STATS_ENABLED": "0",
    }
    quoted = " ".join(f"'{a}'" for a in (*args, out))
    script = f"ip link set lo up && exec '{sys.executable}' -m {module} {quoted}"
    run = subprocess.run(
        ["unshare", "--net", "sh", "-c", script],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=540,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    result: dict[str, Any] = json.loads(out.read_text())
    return result
