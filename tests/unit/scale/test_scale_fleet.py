"""Many models and tenants on `embedserve serve-cluster` (#46), without Ray: pools.yaml's
`models:` / `aliases:` / `tenants:` read as the gateway reads them, one deployment per model's
pool, and the ingress (scale/ingress_app.py) over handles that run the replica's code on real
servers: vectors by name and alias equal each model's own server's; 401 / 403 / 404 / 429 as the
gateway answers them. (The same on a real Ray: tests/integration/test_serve_cluster.py, slow.)"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from fastapi.testclient import TestClient

from embedserve.engine.options import EngineOptions
from embedserve.gateway.app import create_app
from embedserve.gateway.pools.config import GatewayConfigError
from embedserve.gateway.pools.counting import TokenCounter
from tests.helpers.inprocess import LocalReplica, runtime_of, server_client
from tests.helpers.server_process import words

pytest.importorskip("ray")
from embedserve.scale.app import serve_config
from embedserve.scale.cluster_config import ClusterConfig, parse_cluster_config
from embedserve.scale.ingress_app import serve_fleet
from embedserve.scale.manifests import rayservice

ROOT = Path(__file__).resolve().parents[3]
KEYS = {"ACME_KEYS": "acme-1", "BETA_KEYS": "beta-1"}
DET = EngineOptions(deterministic=True)
ROUTES = [{"class": "online", "order": ["short", "long"]}, {"class": "batch", "order": ["long"]}]


def _raw(a: Path | str, b: Path | str, **top: Any) -> dict[str, Any]:
    def entry(model: Path | str) -> dict[str, Any]:
        pools = {"short": {"max_tokens": 16, "max_num_batched_tokens": 256}, "long": {"max_tokens": 64}}
        return {"model": str(model), "pools": pools, "routes": ROUTES}

    tenants = {
        "acme": {"api_keys_env": "ACME_KEYS", "weight": 3},
        "beta": {"api_keys_env": "BETA_KEYS", "models": ["qwen"], "requests_per_minute": 2},
    }
    return {"models": {"qwen": entry(a), "llama/v1": entry(b)}, "aliases": {"latest": "llama/v1"}, **top} | {
        "tenants": tenants
    }


@pytest.fixture(autouse=True)
def _keys(monkeypatch: pytest.MonkeyPatch) -> None:
    for env, value in KEYS.items():
        monkeypatch.setenv(env, value)


def test_models_aliases_and_tenants_are_read_as_the_gateway_reads_them() -> None:
    cluster = parse_cluster_config(_raw("/m/a", "/m/b"))
    assert not cluster.single and cluster.aliases == {"latest": "llama/v1"}
    assert [t.name for t in cluster.tenants] == ["acme", "beta"]
    assert [(p.deployment, p.label, p.model) for p in cluster.pools] == [
        ("pool-qwen-short", "qwen/short", "/m/a"),
        ("pool-qwen-long", "qwen/long", "/m/a"),
        ("pool-llama-v1-short", "llama/v1/short", "/m/b"),
        ("pool-llama-v1-long", "llama/v1/long", "/m/b"),
    ]
    qwen = cluster.models[0]
    assert (
        qwen.gateway.served_model_name == "qwen" and qwen.pool("short").engine.max_num_batched_tokens == 256
    )
    assert [p.upstreams for p in qwen.gateway.pools] == [
        ("serve:pool-qwen-short",),
        ("serve:pool-qwen-long",),
    ]
    # The Serve config carries the mapping: the RayService's app reads back the same cluster.
    (app,) = serve_config(cluster)["applications"]
    assert parse_cluster_config(app["args"]["pools"]) == cluster
    names = [d["name"] for d in app["deployments"]]
    assert names == ["ingress", "metrics-hub", *(p.deployment for p in cluster.pools)]
    # Every pod gets the tenants' key variables from the Secret (the ingress may run on any).
    pods = rayservice(cluster, "embedserve:cpu")["spec"]["rayClusterConfig"]
    head = pods["headGroupSpec"]["template"]["spec"]["containers"][0]
    refs = {e["name"]: e["valueFrom"]["secretKeyRef"]["key"] for e in head["env"] if "valueFrom" in e}
    assert refs == {"ACME_KEYS": "ACME_KEYS", "BETA_KEYS": "BETA_KEYS"}
    # The single-model form is one model, its deployments named as before.
    routes = [{"class": "online", "order": ["all"]}]
    one = parse_cluster_config({"model": "/m/a", "pools": {"all": {"max_tokens": 64}}, "routes": routes})
    assert one.single and [p.deployment for p in one.pools] == ["pool-all"] and one.tenants == ()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda r: r["models"]["qwen"]["pools"]["short"].update(upstreams=["http://x"]), "not 'upstreams:'"),
        (
            lambda r: r["models"]["qwen"]["pools"]["long"].update(model="/m/other"),
            "is not its entry's model",
        ),
        (lambda r: r["models"].update({"llama-v1": r["models"]["qwen"]}), "would both deploy as"),
        (lambda r: r["tenants"]["beta"].update(models=["nope"]), "nope"),
        (lambda r: r.update(pools={}), "each model sets its own"),
        (lambda r: r["models"]["qwen"]["pools"]["short"].update(replicas={"min": 3, "max": 1}), "below min"),
    ],
)
def test_bad_configs_are_refused_naming_the_problem(change: Any, message: str) -> None:
    raw = _raw("/m/a", "/m/b")
    change(raw)
    with pytest.raises(GatewayConfigError, match=message):
        parse_cluster_config(raw)


@pytest.fixture(scope="module")
def servers(qwen3_dir: Path, llama_dir: Path) -> Iterator[tuple[TestClient, TestClient]]:
    # deterministic: a vector does not depend on what it was batched with (the ingress splits by pool)
    with server_client(qwen3_dir, engine=DET) as a, server_client(llama_dir, engine=DET) as b:
        yield a, b


@pytest.fixture(scope="module")
def ingress(
    servers: tuple[TestClient, TestClient], qwen3_dir: Path, llama_dir: Path
) -> Iterator[tuple[TestClient, dict[str, LocalReplica]]]:
    with pytest.MonkeyPatch.context() as mp:
        for env, value in KEYS.items():
            mp.setenv(env, value)
        cluster: ClusterConfig = parse_cluster_config(_raw(qwen3_dir, llama_dir))
        by_model = {"qwen": servers[0], "llama/v1": servers[1]}
        replicas = {
            p.deployment: LocalReplica(runtime_of(by_model[str(m.gateway.served_model_name)]))
            for m in cluster.models
            for p in m.pools
        }
        live, _ = asyncio.run(serve_fleet(cluster, replicas, lambda model: TokenCounter(model)))
        yield TestClient(create_app(live, ("operator",))), replicas


def _embed(client: TestClient, key: str, model: str, texts: list[str]) -> Any:
    headers = {"Authorization": f"Bearer {key}"}
    return client.post("/v1/embeddings", json={"model": model, "input": texts}, headers=headers)


def test_each_model_by_name_and_alias_answers_as_its_own_server(
    ingress: tuple[TestClient, dict[str, LocalReplica]], servers: tuple[TestClient, TestClient]
) -> None:
    client, replicas = ingress
    texts = [words(3), words(40, seed=2), words(5, seed=3)]
    for name, server, served in (("qwen", 0, "qwen"), ("llama/v1", 1, "llama/v1"), ("latest", 1, "llama/v1")):
        before = {d: len(r.calls) for d, r in replicas.items()}
        got = _embed(client, "acme-1", name, texts)
        assert got.status_code == 200, got.text
        direct = servers[server].post("/v1/embeddings", json={"input": texts}).json()
        assert [d["embedding"] for d in got.json()["data"]] == [d["embedding"] for d in direct["data"]]
        assert [d["pool"] for d in got.json()["data"]] == ["short", "long", "short"]
        assert got.json()["model"] == served and got.json()["embedding_schema"] == direct["embedding_schema"]
        prefix = "pool-qwen-" if served == "qwen" else "pool-llama-v1-"
        used = {d for d, r in replicas.items() if len(r.calls) > before[d]}
        assert used == {prefix + "short", prefix + "long"}
    listed = client.get("/v1/models", headers={"Authorization": "Bearer operator"}).json()["data"]
    assert {m["id"]: m["aliases"] for m in listed} == {"qwen": [], "llama/v1": ["latest"]}


def test_tenants_keys_permissions_and_quotas(ingress: tuple[TestClient, dict[str, LocalReplica]]) -> None:
    client, _ = ingress
    assert _embed(client, "nobody", "qwen", ["x"]).status_code == 401
    assert client.post("/v1/embeddings", json={"model": "qwen", "input": ["x"]}).status_code == 401
    refused = _embed(client, "beta-1", "latest", ["x"])
    assert refused.status_code == 403 and "latest" in refused.json()["error"]["message"]
    unknown = _embed(client, "beta-1", "gpt", ["x"])
    assert unknown.status_code == 404 and "'qwen'" in unknown.json()["error"]["message"]
    assert "llama" not in unknown.json()["error"]["message"]  # only the models beta may use
    statuses = [_embed(client, "beta-1", "qwen", ["x"]).status_code for _ in range(3)]
    assert statuses[:2] == [200, 200] and statuses[2] == 429  # 2 requests a minute
    over = _embed(client, "beta-1", "qwen", ["x"])
    assert over.status_code == 429 and int(over.headers["Retry-After"]) >= 1
    assert _embed(client, "acme-1", "qwen", ["x"]).status_code == 200  # another tenant: unaffected
    metrics = client.get("/metrics", headers={"Authorization": "Bearer operator"}).text
    assert 'tenant="beta"' in metrics and 'model="llama/v1"' in metrics
    assert client.get("/metrics", headers={"Authorization": "Bearer acme-1"}).status_code == 401


def test_the_deploy_example_is_a_valid_cluster() -> None:
    raw = yaml.safe_load((ROOT / "deploy/pools.ray-models.yaml").read_text())
    cluster = parse_cluster_config(raw)
    assert len(cluster.models) == 2 and cluster.aliases and len(cluster.tenants) == 2


def test_the_kubernetes_counterpart_is_generated_and_valid() -> None:
    from ray.serve.schema import ServeDeploySchema

    from embedserve.scale.app import app_builder
    from embedserve.scale.cluster_config import load_cluster_config
    from embedserve.scale.manifests import dump

    folder = ROOT / "deploy/k8s/models"
    cluster = load_cluster_config(folder / "pools.yaml")
    text = (folder / "rayservice.yaml").read_text()
    assert text == dump(rayservice(cluster, "embedserve:cpu")), (
        "deploy/k8s/models/rayservice.yaml is stale: embedserve serve-cluster --config "
        "deploy/k8s/models/pools.yaml --emit rayservice > deploy/k8s/models/rayservice.yaml"
    )
    serve = ServeDeploySchema.model_validate(yaml.safe_load(yaml.safe_load(text)["spec"]["serveConfigV2"]))
    (app,) = serve.applications
    assert app_builder(app.args) is not None  # builds from the embedded mapping, no Ray started
    assert {d.name for d in app.deployments} >= {p.deployment for p in cluster.pools}


def test_keys_are_read_before_ray_starts_and_the_rayservice_needs_variables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from embedserve.cli import main
    from embedserve.scale.ingress_app import own_keys

    raw = _raw("/m/a", "/m/b", api_keys_env="OPS_KEYS")
    monkeypatch.setenv("OPS_KEYS", "ops-1,ops-2")
    assert own_keys(parse_cluster_config(raw)) == ("ops-1", "ops-2")  # the gateway's own clients
    config = tmp_path / "pools.yaml"
    config.write_text(yaml.safe_dump(raw))
    monkeypatch.delenv("BETA_KEYS")
    assert main(["serve-cluster", "--config", str(config)]) == 2  # before any Ray starts
    assert "BETA_KEYS" in capsys.readouterr().err
    raw["tenants"]["beta"] = {"api_keys_file": str(tmp_path / "keys")}
    with pytest.raises(GatewayConfigError, match="give api_keys_env"):
        rayservice(parse_cluster_config(raw), "embedserve:cpu")
