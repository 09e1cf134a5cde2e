"""What the server exposes: no input echoed whole in errors, none in metrics or health, keys
compared in constant time and never logged."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tests.helpers.inprocess import server_client

SECRET = "sk-test-" + "k" * 24
MARK = "zebracorn" * 2000  # a long, recognisable input


@pytest.fixture(scope="module")
def client(qwen3_dir: Path) -> Iterator[TestClient]:
    with server_client(qwen3_dir, api_keys=(SECRET,)) as c:
        yield c


AUTH = {"Authorization": f"Bearer {SECRET}"}


@pytest.mark.parametrize(
    "body",
    [
        {"input": [[1, MARK]]},
        {"input": "x", "model": MARK},
        {"input": "x", "prompt_name": MARK},
        {"input": MARK, "dimensions": 9999},
    ],
)
def test_errors_never_echo_the_whole_input(client: TestClient, body: dict[str, object]) -> None:
    resp = client.post("/v1/embeddings", json=body, headers=AUTH)
    assert 400 <= resp.status_code < 500, resp.text
    assert len(resp.text) < 1000 and MARK[:200] not in resp.text


def test_metrics_and_health_do_not_leak_inputs_or_keys(
    client: TestClient, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.DEBUG):
        assert (
            client.post("/v1/embeddings", json={"input": "zebracorn secret"}, headers=AUTH).status_code == 200
        )
        wrong = client.post(
            "/v1/embeddings", json={"input": "x"}, headers={"Authorization": "Bearer nope-key"}
        )
    assert wrong.status_code == 401 and "nope-key" not in wrong.text
    for path in ("/metrics", "/health/ready", "/health/live"):
        text = client.get(path, headers=AUTH).text
        assert "zebracorn" not in text and SECRET not in text
    assert SECRET not in caplog.text and "nope-key" not in caplog.text


def test_api_keys_are_compared_with_compare_digest(monkeypatch: pytest.MonkeyPatch) -> None:
    """The server's and the gateway's keys (api/auth.py): every key through hmac.compare_digest."""
    import asyncio
    import hmac

    from starlette.requests import Request

    from embedserve.api import auth
    from embedserve.api.protocol import ApiError

    compared: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        compared.append((a, b))
        return real(a, b)

    monkeypatch.setattr(auth.hmac, "compare_digest", spy)
    check = auth.bearer_check(("k-one", "k-two"))
    request = Request({"type": "http", "headers": [(b"authorization", b"Bearer k-one")]})
    asyncio.run(check(request))
    assert compared == [(b"k-one", b"k-one"), (b"k-one", b"k-two")]  # every key, not first match
    with pytest.raises(ApiError):
        asyncio.run(check(Request({"type": "http", "headers": []})))
