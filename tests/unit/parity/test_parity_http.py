"""The http backend against a minimal OpenAI-compatible server on loopback."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from embedserve.parity.backends import open_backend
from embedserve.parity.options import ParityError
from tests.helpers.openai_stub import StubState, serve_stub


def _fake(inputs: list[Any]) -> list[list[float]]:
    """A vector that encodes the input's length and first character/id."""
    out = []
    for x in inputs:
        head = ord(x[0]) if isinstance(x, str) else x[0]
        out.append([float(len(x)), float(head), 1.0])
    return out


def test_texts_ids_prompt_order_auth_and_extra_fields(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STUB_KEY", "s3cret")
    state = StubState(_fake, api_key="s3cret", metadata={"model_version": "v7", "dtype": "float32"})
    with serve_stub(state) as url:
        backend = open_backend(f"{url}?api_key_env=STUB_KEY&truncate=end&batch_size=4")
        try:
            assert backend.model_name == "stub-model"  # type: ignore[attr-defined]  # the only listed model
            vectors = backend.embed(["ab", "cde"], "Q: ")
            np.testing.assert_array_equal(vectors, [[5, ord("Q"), 1], [6, ord("Q"), 1]])
            np.testing.assert_array_equal(backend.embed([(7, 8, 9)], ""), [[3, 7, 1]])
            described = backend.describe()
        finally:
            backend.close()
    sent = state.requests[0]
    assert sent["input"] == ["Q: ab", "Q: cde"] and sent["truncate"] == "end"
    assert state.requests[1]["input"] == [[7, 8, 9]]
    assert backend.batch_items == 4
    assert described["model_version"] == "v7" and described["dtype"] == "float32"
    assert "s3cret" not in repr(described)


def test_backpressure_is_retried_then_gives_up() -> None:
    state = StubState(_fake, refusals=[429, 503])
    with serve_stub(state) as url:
        backend = open_backend(f"{url}?model=stub-model")
        try:
            assert backend.embed(["x"], "").shape == (1, 3)
            assert len(state.requests) == 3
            state.refusals = [429] * 3
            tight = open_backend(f"{url}?model=stub-model&retries=1")
            with pytest.raises(ParityError, match="HTTP 429"):
                tight.embed(["x"], "")
            tight.close()
        finally:
            backend.close()


def test_errors_name_the_problem(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NO_SUCH_KEY", raising=False)
    state = StubState(_fake, api_key="k")
    with serve_stub(state) as url:
        with pytest.raises(ParityError, match="HTTP 401"):
            open_backend(url)  # listing models needs the key
        with pytest.raises(ParityError, match="NO_SUCH_KEY"):
            open_backend(f"{url}?api_key_env=NO_SUCH_KEY")
        backend = open_backend(f"{url}?model=other&api_key=k")
        try:
            with pytest.raises(ParityError, match=r"HTTP 404.*not found"):
                backend.embed(["x"], "")
            assert "api_key" not in backend.spec
        finally:
            backend.close()
    with pytest.raises(ParityError, match="ConnectError"):
        open_backend(url)  # the server is gone
