"""Injected faults, in-process: each fails only the requests it touches with a clear status,
readiness tells the truth, and the server recovers without the process dying.

| fault                               | the client sees                                  |
|-------------------------------------|--------------------------------------------------|
| forward pass raises on one input    | 500 "the engine failed to compute this request"  |
|                                     | for that request only (the step re-run by halves)|
| forward pass runs out of memory     | 500 naming OutOfMemoryError; next request 200    |
| tokenizer throws on one input       | 500 "internal error" for that request only       |
| engine loop dies                    | 503 + Retry-After while it restarts, then 200    |
| native kernel fails its self-check  | nothing: PyTorch ops, same vectors               |
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient

from embedserve import Engine
from embedserve.kernels import flash_attention, norm_rope
from tests.helpers.inprocess import runtime_of, server_client
from tests.helpers.reference import cosine, hf_embed_ids, random_ids

POISON = 4242  # a token id the injected faults look for


@pytest.fixture(scope="module")
def client(qwen3_dir: Path) -> Iterator[TestClient]:
    with server_client(qwen3_dir) as c:
        yield c


def _engine(client: TestClient) -> Engine:
    engine = runtime_of(client).engine
    assert engine is not None
    return engine


def _fail_steps_touching_poison(
    client: TestClient, monkeypatch: pytest.MonkeyPatch, error: Exception
) -> None:
    core = _engine(client)._loop.core
    real = core.runner.execute

    def execute(out: Any) -> Any:
        if any(POISON in core.requests[c.request_id].token_ids for c in out.chunks):
            raise error
        return real(out)

    monkeypatch.setattr(core.runner, "execute", execute)


def _healthy(client: TestClient) -> None:
    assert client.get("/health/ready").status_code == 200
    ok = client.post("/v1/embeddings", json={"input": [random_ids(40, seed=1)]})
    assert ok.status_code == 200, ok.text
    stats = _engine(client).stats()
    assert stats["num_running"] == stats["num_waiting"] == stats["kv_blocks_used"] == 0


def test_a_forward_that_raises_fails_the_request_that_makes_it_fail_only(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    bodies = [{"input": [random_ids(30 + i, seed=i)]} for i in range(8)]
    undisturbed = [client.post("/v1/embeddings", json=b).json()["data"][0]["embedding"] for b in bodies]
    _fail_steps_touching_poison(client, monkeypatch, RuntimeError("injected device fault"))
    bodies[3] = {"input": [[*random_ids(30, seed=3), POISON]]}
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda b: client.post("/v1/embeddings", json=b), bodies))
    statuses = [a.status_code for a in answers]
    # Whatever shared its step, a failed step is re-run by halves: only the poisoned one fails.
    assert statuses == [200] * 3 + [500] + [200] * 4, [a.text[:200] for a in answers]
    assert "injected device fault" in answers[3].json()["error"]["message"]
    assert answers[3].json()["error"]["type"] == "server_error"
    for i, a in enumerate(answers):
        if i != 3:
            got = np.array(a.json()["data"][0]["embedding"])
            assert cosine(got[None], np.array(undisturbed[i])[None])[0] >= 0.99999
    monkeypatch.undo()
    _healthy(client)


def test_out_of_memory_in_a_forward_is_a_500_and_the_next_request_runs(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fail_steps_touching_poison(client, monkeypatch, torch.OutOfMemoryError("injected: out of memory"))
    resp = client.post("/v1/embeddings", json={"input": [[1, 2, POISON]]})
    assert resp.status_code == 500 and "OutOfMemoryError" in resp.json()["error"]["message"]
    assert client.post("/v1/embeddings", json={"input": "still served"}).status_code == 200
    _healthy(client)


def test_a_tokenizer_that_throws_on_one_input_fails_that_request_only(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    tokenizer = _engine(client).tokenizer
    real = tokenizer.encode

    def encode(item: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(item, str) and "poison" in item:
            raise RuntimeError("injected tokenizer fault")
        return real(item, *args, **kwargs)

    monkeypatch.setattr(tokenizer, "encode", encode)
    bad = client.post("/v1/embeddings", json={"input": ["fine", "poison " * 10_000]})
    assert bad.status_code == 500
    message = bad.json()["error"]["message"]
    assert message.startswith("internal error: RuntimeError: injected tokenizer fault")
    assert "poison poison" not in message  # the input is never echoed back
    assert client.post("/v1/embeddings", json={"input": ["fine", "also fine"]}).status_code == 200
    _healthy(client)


def test_a_dead_engine_loop_is_503_then_restarted_in_process(qwen3_dir: Path) -> None:
    with server_client(qwen3_dir) as client:
        core = _engine(client)._loop.core

        def broken() -> Any:
            raise RuntimeError("injected scheduler bug")

        core.scheduler.schedule = broken  # type: ignore[method-assign]
        died = client.post("/v1/embeddings", json={"input": "x"})
        assert died.status_code == 503 and "injected scheduler bug" in died.json()["error"]["message"]
        assert died.headers["retry-after"].isdigit()
        seen = set()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            ready = client.get("/health/ready")
            seen.add((ready.status_code, ready.json()["detail"]))
            if ready.status_code == 200:
                break
            refused = client.post("/v1/embeddings", json={"input": "x"})  # 200 once restarted
            assert refused.status_code in (200, 503)
            assert refused.status_code == 200 or "retry-after" in refused.headers
            time.sleep(0.05)
        assert ready.status_code == 200, seen
        assert any(status == 503 for status, _ in seen), seen  # readiness told the truth meanwhile
        assert runtime_of(client).restarts == 1
        _healthy(client)


def test_a_native_kernel_failing_its_self_check_falls_back_to_pytorch(
    qwen3_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def wrong(*args: Any, **kwargs: Any) -> torch.Tensor:
        raise RuntimeError("injected kernel fault")

    monkeypatch.setattr(flash_attention, "_run", wrong)
    monkeypatch.setattr(norm_rope, "add_rms_norm", wrong)
    for check in (flash_attention._kernel, norm_rope.available):  # flash: the checked entry per dtype
        check.cache_clear()
    try:
        assert not flash_attention.available(torch.float32) and not norm_rope.available(torch.float32)
        seqs = [random_ids(300, seed=5)]
        with Engine.from_pretrained(qwen3_dir, max_model_len=512) as engine:
            got = engine.embed(seqs)
        assert cosine(got, hf_embed_ids(qwen3_dir, seqs))[0] >= 0.99999
        assert np.isfinite(got).all()
        assert "failed its" in caplog.text or "self-check" in caplog.text
    finally:
        monkeypatch.undo()
        for check in (flash_attention._kernel, norm_rope.available):
            check.cache_clear()
