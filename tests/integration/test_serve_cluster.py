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
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
        "OMP_NUM_THREADS": "1",
        "RAY_USAGE_STATS_ENABLED": "0",
    }
    module = "tests.helpers.serve_cluster_run"
    script = f"ip link set lo up && exec '{sys.executable}' -m {module} '{qwen3_dir}' '{reranker}' '{out}'"
    run = subprocess.run(
        ["unshare", "--net", "sh", "-c", script],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=540,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    result = json.loads(out.read_text())
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
