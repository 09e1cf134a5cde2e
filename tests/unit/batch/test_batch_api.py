"""The online batch API (`serve --batch-dir`, `gateway --batch-dir`) through the official `openai`
client on loopback: outputs bit-equal to direct calls, all-or-nothing validation with line
numbers, cancel and expiry mid-run (partial outputs, each line once), tenants, limits, the
routes off without the flag, and the gateway's form (batch pools)."""

from __future__ import annotations

import contextlib
import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from fastapi.testclient import TestClient

from embedserve.api.refusals import CLASS_HEADER
from embedserve.batch import online
from embedserve.batch.settings import BatchSettings
from embedserve.engine.options import EngineOptions
from embedserve.server.app import create_app
from embedserve.server.runtime import ServerSettings
from tests.helpers.fuzz import threaded_server
from tests.helpers.inprocess import gateway_app, server_client, slow_steps
from tests.helpers.server_process import start_server

FINAL = ("completed", "failed", "cancelled", "expired")
BODIES: list[dict[str, Any]] = [
    {"input": "hello world"},
    {"input": ["two texts", "in one body"], "dimensions": 16},
    {"input": "naïve café, 東京", "encoding_format": "base64"},
    {"input": "a fourth"},
]


def _line(cid: str, body: Any, url: str = "/v1/embeddings") -> str:
    return json.dumps({"custom_id": cid, "method": "POST", "url": url, "body": body})


def _jsonl(lines: list[str]) -> bytes:
    return "".join(x + "\n" for x in lines).encode()


def _stable(body: Any) -> Any:
    return {k: v for k, v in body.items() if k not in ("id", "created")} if isinstance(body, dict) else body


@contextlib.contextmanager
def batch_server(model_dir: Path, batch_dir: Path, **settings: Any) -> Iterator[str]:
    """A deterministic server with the batch API on a real loopback socket (its lifespan running)."""
    settings.setdefault("engine", EngineOptions(deterministic=True))
    app = create_app(
        ServerSettings(model=str(model_dir), warmup_lengths=(16,), batch=BatchSettings(batch_dir), **settings)
    )
    with threaded_server(app, lifespan="on") as base:
        deadline = time.monotonic() + 120
        while httpx.get(f"{base}/health/ready").status_code != 200:
            assert time.monotonic() < deadline, "server not ready"
            time.sleep(0.05)
        yield base


def _client(base: str, key: str = "unused") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0)


def _wait(client: openai.OpenAI, batch_id: str, until: tuple[str, ...] = FINAL, timeout: float = 120) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        b = client.batches.retrieve(batch_id)
        if b.status in until:
            return b
        assert time.monotonic() < deadline, f"batch still {b.status}"
        time.sleep(0.05)


def _records(client: openai.OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    return [json.loads(x) for x in client.files.content(file_id).text.splitlines()]


def _submit(client: openai.OpenAI, lines: list[str], endpoint: str = "/v1/embeddings") -> Any:
    f = client.files.create(file=("in.jsonl", _jsonl(lines)), purpose="batch")
    return client.batches.create(input_file_id=f.id, endpoint=endpoint, completion_window="24h")  # type: ignore[arg-type]


def _upload(c: TestClient, lines: list[str]) -> str:
    r = c.post("/v1/files", files={"file": ("in.jsonl", _jsonl(lines))}, data={"purpose": "batch"})
    assert r.status_code == 200, r.text
    return str(r.json()["id"])


def _create(c: TestClient, file_id: str) -> str:
    body = {"input_file_id": file_id, "endpoint": "/v1/embeddings", "completion_window": "24h"}
    r = c.post("/v1/batches", json=body)
    assert r.status_code == 200, r.text
    return str(r.json()["id"])


def _poll(c: TestClient, batch_id: str, done: Any = lambda b: b["status"] in FINAL) -> dict[str, Any]:
    deadline = time.monotonic() + 120
    while not done(got := c.get(f"/v1/batches/{batch_id}").json()):
        assert time.monotonic() < deadline, got
        time.sleep(0.02)
    return dict(got)


def _content(c: TestClient, file_id: str) -> list[dict[str, Any]]:
    return [json.loads(x) for x in c.get(f"/v1/files/{file_id}/content").text.splitlines()]


def test_a_batch_through_the_openai_client_equals_direct_calls(qwen3_dir: Path, tmp_path: Path) -> None:
    with batch_server(qwen3_dir, tmp_path / "b") as base:
        client = _client(base)
        f = client.files.create(
            file=("in.jsonl", _jsonl([_line(f"r{i}", b) for i, b in enumerate(BODIES)])), purpose="batch"
        )
        assert (f.object, f.purpose, f.filename, f.status) == ("file", "batch", "in.jsonl", "processed")
        assert client.files.retrieve(f.id).bytes == f.bytes
        b = client.batches.create(
            input_file_id=f.id,
            endpoint="/v1/embeddings",
            completion_window="24h",
            metadata={"job": "nightly"},
        )
        assert b.status == "validating" and b.metadata == {"job": "nightly"}
        b = _wait(client, b.id)
        assert b.status == "completed", b
        assert (b.request_counts.total, b.request_counts.completed, b.request_counts.failed) == (4, 4, 0)
        assert b.in_progress_at and b.finalizing_at and b.completed_at and b.error_file_id is None
        recs = _records(client, b.output_file_id)
        assert [r["custom_id"] for r in recs] == ["r0", "r1", "r2", "r3"]
        direct = [_stable(httpx.post(f"{base}/v1/embeddings", json=body).json()) for body in BODIES]
        assert [_stable(r["response"]["body"]) for r in recs] == direct  # bit-equal JSON
        assert b.usage is not None and b.usage.total_tokens == sum(d["usage"]["total_tokens"] for d in direct)
        out = client.files.retrieve(b.output_file_id)
        assert out.purpose == "batch_output"
        assert [x.id for x in client.batches.list().data] == [b.id]
        assert {x.id for x in client.files.list().data} == {f.id, b.output_file_id}
        assert client.files.delete(f.id).deleted
        with pytest.raises(openai.NotFoundError):
            client.files.retrieve(f.id)


def test_validation_is_all_or_nothing_with_line_numbers(qwen3_dir: Path, tmp_path: Path) -> None:
    lines = [
        _line("ok", {"input": "fine"}),
        "{not json",
        _line("other-url", {"texts": ["x"]}, "/v2/embed"),
        _line("ok", {"input": "a custom_id seen on line 1"}),
        _line("bad-body", {"inputs": "x"}),
        _line("too-long", {"input": "word " * 5000, "truncate": "error"}),
        _line("ok2", {"input": "also fine"}),
    ]
    engine = EngineOptions(deterministic=True, max_model_len=512)
    with batch_server(qwen3_dir, tmp_path / "b", engine=engine) as base:
        client = _client(base)
        b = _wait(client, _submit(client, lines).id)
        assert b.status == "failed" and b.failed_at and b.output_file_id is None
        assert b.request_counts.completed == 0  # nothing ran
        errors = b.errors.data
        assert [e.line for e in errors] == [2, 3, 4, 5, 6]
        text = " | ".join(e.message or "" for e in errors)
        assert "not valid JSON" in text and "is not the batch's endpoint /v1/embeddings" in text
        assert "earlier line" in text and "422" in text and "inputs" in text
        assert "too-long" in errors[4].message and "tokens" in errors[4].message
        assert errors[2].code == "duplicate_custom_id"
        recs = _records(client, b.error_file_id)
        assert [(r["line"], r["custom_id"]) for r in recs] == [
            (2, None),
            (3, "other-url"),
            (4, "ok"),
            (5, "bad-body"),
            (6, "too-long"),
        ]
        # An empty file fails too, and says so.
        empty = _wait(client, _submit(client, []).id)
        assert empty.status == "failed" and "no lines" in (empty.errors.data[0].message or "")


def test_cancel_mid_run_keeps_what_was_answered_each_line_once(
    qwen3_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    n = 200
    lines = [_line(f"r{i}", {"input": f"text number {i}"}) for i in range(n)]
    settings: dict[str, Any] = {
        "batch": BatchSettings(tmp_path / "b"),
        "engine": EngineOptions(deterministic=True),
    }
    with server_client(qwen3_dir, **settings) as c, slow_steps(c, monkeypatch, seconds=0.05):
        bid = _create(c, _upload(c, lines))
        _poll(c, bid, lambda b: b["request_counts"]["completed"] >= 5)
        cancelling = c.post(f"/v1/batches/{bid}/cancel").json()
        assert cancelling["status"] == "cancelling" and cancelling["cancelling_at"]
        got = _poll(c, bid, lambda b: b["status"] != "cancelling")
        assert got["status"] == "cancelled" and got["cancelled_at"]
        out = _content(c, got["output_file_id"])
        assert 5 <= len(out) < n and got["request_counts"]["completed"] == len(out)
        assert [r["custom_id"] for r in out] == [f"r{i}" for i in range(len(out))]  # input order, once
        again = c.post(f"/v1/batches/{bid}/cancel")
        assert again.status_code == 409 and "cancelled" in again.json()["error"]["message"]


def test_a_batch_past_its_window_expires_with_its_partial_output(
    qwen3_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a five-second window: under CI's parallel load the job's first step once finished after a
    # two-second one had closed (0 lines completed)
    monkeypatch.setitem(online.COMPLETION_WINDOWS, "24h", 5)
    n = 4000  # at most 64 lines a step (batch/share.py), 0.2 s a step: over 12 s
    lines = [_line(f"r{i}", {"input": f"text {i}"}) for i in range(n)]
    with server_client(qwen3_dir, batch=BatchSettings(tmp_path / "b")) as c, slow_steps(c, monkeypatch, 0.2):
        got = _poll(c, _create(c, _upload(c, lines)))
        assert got["status"] == "expired" and got["expired_at"]
        assert 0 < got["request_counts"]["completed"] < n
        assert len(_content(c, got["output_file_id"])) == got["request_counts"]["completed"]


def test_tenants_see_only_their_own_files_and_batches(qwen3_dir: Path, tmp_path: Path) -> None:
    with batch_server(qwen3_dir, tmp_path / "b", api_keys=("key-a", "key-b")) as base:
        a, b = _client(base, "key-a"), _client(base, "key-b")
        batch = _wait(a, _submit(a, [_line("x", {"input": "mine"})]).id)
        assert batch.status == "completed"
        for call in (
            lambda: b.batches.retrieve(batch.id),
            lambda: b.files.retrieve(batch.input_file_id),
            lambda: b.files.content(batch.output_file_id),
            lambda: b.batches.cancel(batch.id),
            lambda: b.files.delete(batch.input_file_id),
        ):
            with pytest.raises(openai.NotFoundError):
                call()
        with pytest.raises(openai.NotFoundError):  # another tenant's input file cannot be used either
            b.batches.create(
                input_file_id=batch.input_file_id, endpoint="/v1/embeddings", completion_window="24h"
            )
        assert b.batches.list().data == [] and b.files.list().data == []
        assert [x.id for x in a.batches.list().data] == [batch.id]
        with pytest.raises(openai.AuthenticationError):
            _client(base, "wrong").files.list()


def test_bad_requests_get_clear_4xx(qwen3_dir: Path, tmp_path: Path) -> None:
    with server_client(qwen3_dir, batch=BatchSettings(tmp_path / "b", max_file_bytes=1000)) as c:
        ok = _jsonl([_line("a", {"input": "x"})])
        r = c.post("/v1/files", files={"file": ("in.jsonl", ok)}, data={"purpose": "fine-tune"})
        assert r.status_code == 400 and "purpose must be 'batch'" in r.json()["error"]["message"]
        r = c.post("/v1/files", files={"file": ("big.jsonl", b"x" * 5000)}, data={"purpose": "batch"})
        assert r.status_code == 413
        r = c.post("/v1/files", data={"purpose": "batch"})
        assert r.status_code == 400
        fid = c.post("/v1/files", files={"file": ("in.jsonl", ok)}, data={"purpose": "batch"}).json()["id"]
        cases = [
            (
                {"input_file_id": fid, "endpoint": "/v1/embeddings", "completion_window": "1h"},
                400,
                "completion_window",
            ),
            (
                {"input_file_id": fid, "endpoint": "/v1/chat/completions", "completion_window": "24h"},
                400,
                "endpoint",
            ),
            (
                {"input_file_id": "file-nope", "endpoint": "/v1/embeddings", "completion_window": "24h"},
                404,
                "no file",
            ),
            ({"endpoint": "/v1/embeddings", "completion_window": "24h"}, 400, "input_file_id"),
        ]
        for body, status, words in cases:
            r = c.post("/v1/batches", json=body)
            assert r.status_code == status and words in r.json()["error"]["message"], (body, r.text)
        assert c.get("/v1/batches/batch_nope").status_code == 404
        assert c.get("/v1/batches?limit=0").status_code == 400
        assert c.get("/v1/files/../etc").status_code == 404


def test_without_batch_dir_the_routes_say_how_to_turn_them_on(qwen3_dir: Path) -> None:
    with server_client(qwen3_dir) as c:
        for method, path in (("GET", "/v1/files"), ("POST", "/v1/batches"), ("GET", "/v1/batches/batch_x")):
            r = c.request(method, path, json={})
            assert r.status_code == 404 and "--batch-dir" in r.json()["error"]["message"], r.text


def test_the_gateway_runs_batches_on_its_batch_pools(qwen3_dir: Path, tmp_path: Path) -> None:
    with server_client(qwen3_dir, engine=EngineOptions(deterministic=True)) as server:
        gw = gateway_app(server.app, qwen3_dir, batch_dir=tmp_path / "gw")
        with TestClient(gw) as c:
            lines = [_line(f"r{i}", b) for i, b in enumerate(BODIES)]
            too_long = _line("long", {"input": "word " * 5000})  # over every pool's max_tokens
            failed = _poll(c, _create(c, _upload(c, [*lines, too_long])))
            assert failed["status"] == "failed" and failed["errors"]["data"][0]["line"] == 5
            got = _poll(c, _create(c, _upload(c, lines)))
            assert got["status"] == "completed", got
            # The lines went to the batch route's pool as batch traffic (5 inputs in 4 bodies).
            metrics = c.get("/metrics").text
            assert 'embedserve_gateway_pool_inputs_total{pool="long",traffic_class="batch"} 5.0' in metrics
            # Equal to a client's batch-class requests (answered by the same pool, named in each item).
            direct = [
                _stable(c.post("/v1/embeddings", json=body, headers={CLASS_HEADER: "batch"}).json())
                for body in BODIES
            ]
            assert [_stable(r["response"]["body"]) for r in _content(c, got["output_file_id"])] == direct


def test_a_sigkill_mid_run_resumes_at_restart_every_line_once(qwen3_dir: Path, tmp_path: Path) -> None:
    n = 1500  # CI time: the kill comes once the output holds 20 KB, a few dozen lines
    lines = [_line(f"r{i}", {"input": f"text number {i}"}) for i in range(n)]
    batch_dir = tmp_path / "b"
    args = ("--batch-dir", str(batch_dir), "--deterministic", "--warmup-lengths", "16")
    server = start_server(qwen3_dir, tmp_path, *args)
    try:
        server.wait_ready()
        client = _client(server.base_url)
        batch_id = _submit(client, lines).id
        record = batch_dir / "batches" / f"{batch_id}.json"
        deadline = time.monotonic() + 120
        while True:  # until the output file on disk holds some lines
            rec = json.loads(record.read_text())
            out = batch_dir / "files" / f"{rec['_output_id']}.jsonl"
            if out.exists() and out.stat().st_size > 20_000:
                break
            assert time.monotonic() < deadline, server.log()
            time.sleep(0.01)
        server.proc.send_signal(signal.SIGKILL)
        server.proc.wait(30)
    finally:
        server.terminate()
    assert json.loads(record.read_text())["status"] == "in_progress"
    written = len(out.read_bytes().splitlines())
    assert 0 < written < n  # killed mid-run
    again = start_server(qwen3_dir, tmp_path, *args)
    try:
        again.wait_ready()
        client = _client(again.base_url)
        b = _wait(client, batch_id, timeout=300)
        assert b.status == "completed" and b.request_counts.completed == n and b.request_counts.failed == 0
        recs = _records(client, b.output_file_id)
        assert [r["custom_id"] for r in recs] == [f"r{i}" for i in range(n)]  # each once, in order
        for i in (0, written - 1, written, n - 1):  # before, at and after the kill: as a direct call
            direct = httpx.post(f"{again.base_url}/v1/embeddings", json={"input": f"text number {i}"})
            assert _stable(recs[i]["response"]["body"]) == _stable(direct.json())
    finally:
        again.terminate()
