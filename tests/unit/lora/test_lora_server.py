"""LoRA adapters through the server: the `openai` client picks one by `model`, /v1/models lists
each with its own schema, unknown names get 404s naming the served ones, and adapters load and
unload at run time on vLLM's admin routes (API key required)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
from fastapi.testclient import TestClient

from embedserve.engine.options import EngineOptions
from tests.helpers.fuzz import threaded_server
from tests.helpers.inprocess import server_client
from tests.helpers.reference import cosine, random_ids
from tests.helpers.tiny_lora import DECODER_TARGETS, make_adapter, peft_embed

pytest.importorskip("peft")
KEY = "admin-key"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def adapters(qwen3_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("lora-server")
    return {
        "legal": make_adapter(qwen3_dir, root / "legal", 8, DECODER_TARGETS, seed=11),
        "med": make_adapter(qwen3_dir, root / "med", 16, ["q_proj", "v_proj", "up_proj"], seed=12),
        "late": make_adapter(qwen3_dir, root / "late", 4, ["o_proj"], seed=13),
    }


@pytest.fixture(scope="module")
def client(qwen3_dir: Path, adapters: dict[str, Path]) -> Iterator[TestClient]:
    modules = tuple(f"{n}={adapters[n]}" for n in ("legal", "med"))
    options = EngineOptions(lora_modules=modules, max_loras=3, max_num_batched_tokens=256)
    with server_client(qwen3_dir, engine=options, served_model_name="base", api_keys=(KEY,)) as c:
        yield c


def test_the_openai_client_picks_an_adapter_by_model(
    client: TestClient, qwen3_dir: Path, adapters: dict[str, Path]
) -> None:
    seqs = [random_ids(n, seed=n) for n in (6, 90)]
    with threaded_server(client.app) as url:
        api = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0)
        got = {
            name: np.array([d.embedding for d in api.embeddings.create(model=name, input=seqs).data])
            for name in ("base", "legal", "med")
        }
        with pytest.raises(openai.NotFoundError, match="base, legal, med"):
            api.embeddings.create(model="nope", input=seqs)
    for name in ("base", "legal", "med"):
        want = peft_embed(qwen3_dir, adapters.get(name), seqs)
        assert cosine(got[name], want).min() >= 0.99999, name


def test_models_lists_every_adapter_with_its_own_schema(client: TestClient) -> None:
    cards = client.get("/v1/models", headers=AUTH).json()["data"]
    assert [c["id"] for c in cards] == ["base", "legal", "med"]
    assert len({c["embedding_schema"] for c in cards}) == 3
    assert [c.get("parent") for c in cards] == [None, "base", "base"]
    assert cards[1]["model_version"].startswith(cards[0]["model_version"] + "+lora.")
    card = client.get("/v1/models/legal", headers=AUTH).json()
    assert card["id"] == "legal" and card["embedding_schema"] == cards[1]["embedding_schema"]
    resp = client.post("/v1/embeddings", json={"model": "med", "input": "hello"}, headers=AUTH)
    assert resp.json()["model"] == "med" and resp.json()["embedding_schema"] == cards[2]["embedding_schema"]
    missing = client.get("/v1/models/other", headers=AUTH)
    assert missing.status_code == 404 and "base, legal, med" in missing.json()["error"]["message"]


def test_adapters_load_and_unload_at_run_time(
    client: TestClient, qwen3_dir: Path, adapters: dict[str, Path]
) -> None:
    body = {"lora_name": "late", "lora_path": str(adapters["late"])}
    assert client.post("/v1/load_lora_adapter", json=body).status_code == 401
    resp = client.post("/v1/load_lora_adapter", json=body, headers=AUTH)
    assert resp.status_code == 200 and "late" in resp.text
    seq = [random_ids(40, seed=4)]
    got = client.post("/v1/embeddings", json={"model": "late", "input": seq}, headers=AUTH).json()
    assert (
        cosine(np.array([got["data"][0]["embedding"]]), peft_embed(qwen3_dir, adapters["late"], seq))[0]
        >= 0.99999
    )
    refused = [
        ({"lora_name": "late", "lora_path": str(adapters["med"])}, 400, "already loaded"),
        ({"lora_name": "base", "lora_path": str(adapters["med"])}, 400, "base model's name"),
        ({"lora_name": "x", "lora_path": "/nonexistent"}, 400, "adapter_config.json is missing"),
        ({"lora_name": "x", "lora_path": str(adapters["med"])}, 400, "--max-loras"),
        ({"lora_name": "x"}, 422, "lora_path"),
    ]
    for bad, status, message in refused:
        resp = client.post("/v1/load_lora_adapter", json=bad, headers=AUTH)
        assert resp.status_code == status and message in resp.text, (bad, resp.text)
    assert client.post("/v1/unload_lora_adapter", json={"lora_name": "late"}, headers=AUTH).status_code == 200
    gone = client.post("/v1/embeddings", json={"model": "late", "input": "x"}, headers=AUTH)
    assert gone.status_code == 404 and "base, legal, med" in gone.text
    again = client.post("/v1/unload_lora_adapter", json={"lora_name": "late"}, headers=AUTH)
    assert again.status_code == 404


def test_a_server_without_an_api_key_loads_no_adapter_at_run_time(
    qwen3_dir: Path, adapters: dict[str, Path]
) -> None:
    with server_client(qwen3_dir, engine=EngineOptions(enable_lora=True)) as c:
        resp = c.post("/v1/load_lora_adapter", json={"lora_name": "a", "lora_path": str(adapters["late"])})
        assert resp.status_code == 403 and "--api-key" in resp.text
        assert [m["id"] for m in c.get("/v1/models").json()["data"]] == [qwen3_dir.name]


def test_a_merged_adapter_is_served_alone_under_its_name(qwen3_dir: Path, adapters: dict[str, Path]) -> None:
    options = EngineOptions(lora_modules=(f"med={adapters['med']}",), merge_lora=True)
    seqs = [random_ids(30, seed=8)]
    with server_client(qwen3_dir, engine=options) as c:
        cards = c.get("/v1/models").json()["data"]
        assert [m["id"] for m in cards] == ["med"] and "+lora." in cards[0]["model_version"]
        got = c.post("/v1/embeddings", json={"model": "med", "input": seqs}).json()["data"][0]["embedding"]
        assert c.post("/v1/embeddings", json={"model": qwen3_dir.name, "input": "x"}).status_code == 404
    assert cosine(np.array([got]), peft_embed(qwen3_dir, adapters["med"], seqs))[0] >= 0.99999


def test_serve_takes_vllms_lora_flags(qwen3_dir: Path, adapters: dict[str, Path], tmp_path: Path) -> None:
    from tests.helpers.server_process import start_server

    server = start_server(
        qwen3_dir, tmp_path, "--enable-lora", "--lora-modules", f"legal={adapters['legal']}",
        f"med={adapters['med']}", "--max-loras", "2", "--max-lora-rank", "16", "--warmup-lengths", "8",
    )  # fmt: skip
    try:
        server.wait_ready()
        models = httpx.get(f"{server.base_url}/v1/models", timeout=30).json()["data"]
        assert [m["id"] for m in models] == [qwen3_dir.name, "legal", "med"]
    finally:
        server.terminate()


def test_the_gateway_maps_tenants_and_aliases_to_adapters(
    client: TestClient, qwen3_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A `models:` entry's adapters are served names of the same pools: counted with the base
    model's tokenizer, each answered with its own schema; tenants and aliases name them."""
    import asyncio

    from embedserve.gateway.app import create_app
    from embedserve.gateway.fleet_config import parse_fleet
    from embedserve.gateway.live import build

    for var, value in (("ACME_KEYS", "acme-1"), ("BETA_KEYS", "beta-1")):
        monkeypatch.setenv(var, value)
    pools = {
        "short": {"max_tokens": 32, "upstreams": ["http://short:1"]},
        "long": {"max_tokens": 512, "upstreams": ["http://long:2"]},
    }
    entry = {
        "model": str(qwen3_dir),
        "pools": pools,
        "routes": [{"class": "online", "order": ["short", "long"]}],
    }
    config = parse_fleet(
        {
            "models": {"base": {**entry, "adapters": ["legal", "med"]}},
            "aliases": {"legal-latest": "legal"},
            "tenants": {
                "acme": {"api_keys_env": "ACME_KEYS", "models": ["legal", "base"]},
                "beta": {"api_keys_env": "BETA_KEYS", "models": ["med"]},
            },
        }
    )
    seqs = [random_ids(5, seed=1), random_ids(200, seed=2)]  # one per pool
    direct = client.post("/v1/embeddings", json={"model": "legal", "input": seqs}, headers=AUTH).json()

    async def go() -> None:
        upstream = httpx.AsyncClient(transport=httpx.ASGITransport(app=client.app), headers=AUTH)
        built = await build(config, lambda model: str(qwen3_dir), upstream, None)
        try:
            app = create_app(built.live)
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as gw:

                async def embed(key: str, model: str) -> httpx.Response:
                    body = {"model": model, "input": seqs}
                    return await gw.post(
                        "/v1/embeddings", json=body, headers={"Authorization": f"Bearer {key}"}
                    )

                r = await embed("acme-1", "legal-latest")
                assert r.status_code == 200, r.text
                assert r.json()["model"] == "legal" and [d["pool"] for d in r.json()["data"]] == [
                    "short",
                    "long",
                ]
                assert r.json()["embedding_schema"] == direct["embedding_schema"]
                got = np.array([d["embedding"] for d in r.json()["data"]])
                want = np.array([d["embedding"] for d in direct["data"]])
                assert cosine(got, want).min() >= 0.99999
                denied = await embed("acme-1", "med")
                assert denied.status_code == 403 and "may not use model 'med'" in denied.text
                assert (await embed("beta-1", "med")).status_code == 200
                missing = await embed("acme-1", "nope")
                assert (
                    missing.status_code == 404 and "'legal'" in missing.text and "'med'" not in missing.text
                )
                listed = await gw.get("/v1/models", headers={"Authorization": "Bearer acme-1"})
                assert {m["id"] for m in listed.json()["data"]} >= {"base", "legal"}
        finally:
            for s in built.sets:
                await s.close()
            await upstream.aclose()

    asyncio.run(go())


def test_load_inplace_keeps_the_old_adapter_when_the_new_one_is_refused(
    client: TestClient, adapters: dict[str, Path], tmp_path: Path
) -> None:
    seq = [random_ids(20, seed=7)]
    before = client.post("/v1/embeddings", json={"model": "med", "input": seq}, headers=AUTH).json()
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "adapter_config.json").write_text((adapters["med"] / "adapter_config.json").read_text())
    (broken / "adapter_model.safetensors").write_bytes(b"not a safetensors file")
    body = {"lora_name": "med", "lora_path": str(broken), "load_inplace": True}
    resp = client.post("/v1/load_lora_adapter", json=body, headers=AUTH)
    assert resp.status_code == 400 and "cannot read the adapter" in resp.text
    after = client.post("/v1/embeddings", json={"model": "med", "input": seq}, headers=AUTH).json()
    vectors = [np.array([d["embedding"] for d in r["data"]]) for r in (before, after)]
    assert cosine(*vectors)[0] >= 0.99999  # still the old adapter (a prefix-cache hit may move the last bits)
    assert after["embedding_schema"] == before["embedding_schema"]
    body = {"lora_name": "med", "lora_path": str(adapters["late"]), "load_inplace": True}
    assert client.post("/v1/load_lora_adapter", json=body, headers=AUTH).status_code == 200
    swapped = client.post("/v1/embeddings", json={"model": "med", "input": seq}, headers=AUTH).json()
    assert swapped["embedding_schema"] != before["embedding_schema"]
    body = {"lora_name": "med", "lora_path": str(adapters["med"]), "load_inplace": True}
    assert client.post("/v1/load_lora_adapter", json=body, headers=AUTH).status_code == 200


def test_batch_lines_name_adapters(qwen3_dir: Path, adapters: dict[str, Path], tmp_path: Path) -> None:
    from embedserve.batch.settings import BatchSettings

    options = EngineOptions(lora_modules=(f"legal={adapters['legal']}",))
    seqs = [random_ids(12, seed=3)]
    with server_client(qwen3_dir, engine=options, batch=BatchSettings(tmp_path / "b")) as c:
        lines = [
            {"custom_id": m, "method": "POST", "url": "/v1/embeddings", "body": {"model": m, "input": seqs}}
            for m in ("legal", qwen3_dir.name)
        ]
        content = "".join(json.dumps(x) + "\n" for x in lines).encode()
        file_id = c.post(
            "/v1/files", files={"file": ("in.jsonl", content)}, data={"purpose": "batch"}
        ).json()["id"]
        body = {"input_file_id": file_id, "endpoint": "/v1/embeddings", "completion_window": "24h"}
        batch = c.post("/v1/batches", json=body).json()
        deadline = time.monotonic() + 60
        while (got := c.get(f"/v1/batches/{batch['id']}").json())["status"] not in ("completed", "failed"):
            assert time.monotonic() < deadline, got
        assert got["status"] == "completed", got
        out = [json.loads(x) for x in c.get(f"/v1/files/{got['output_file_id']}/content").text.splitlines()]
        by_id = {r["custom_id"]: r["response"]["body"] for r in out}
        direct = c.post("/v1/embeddings", json={"model": "legal", "input": seqs}).json()
        assert by_id["legal"]["model"] == "legal" and by_id["legal"]["data"] == direct["data"]
        assert by_id[qwen3_dir.name]["embedding_schema"] != direct["embedding_schema"]
