"""A minimal OpenAI-compatible embeddings server on 127.0.0.1 (a thread) for backend tests."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

EmbedFn = Callable[[list[Any]], list[list[float]]]


@dataclass
class StubState:
    embed: EmbedFn
    model: str = "stub-model"
    api_key: str | None = None
    # Statuses to answer before serving normally (e.g. [429] tests the retry path).
    refusals: list[int] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)  # sent with every embeddings reply


def _handler(state: StubState) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:  # keep test output clean
            pass

        def _reply(self, status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)

        def _authorized(self) -> bool:
            if state.api_key and self.headers.get("Authorization") != f"Bearer {state.api_key}":
                self._reply(401, {"error": {"message": "bad api key"}})
                return False
            return True

        def do_GET(self) -> None:
            if self._authorized() and self.path == "/v1/models":
                self._reply(200, {"object": "list", "data": [{"id": state.model, "object": "model"}]})

        def do_POST(self) -> None:
            if not self._authorized():
                return
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            state.requests.append(body)
            if state.refusals:
                self._reply(state.refusals.pop(0), {"error": {"message": "busy"}}, {"Retry-After": "0"})
                return
            if body.get("model") != state.model:
                self._reply(404, {"error": {"message": f"model {body.get('model')!r} not found"}})
                return
            vectors = state.embed(body["input"])
            data = [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(vectors)]
            data.reverse()  # clients must order by `index`, not by position
            usage = {"prompt_tokens": len(vectors), "total_tokens": len(vectors)}
            reply = {"object": "list", "data": data, "model": state.model, "usage": usage}
            self._reply(200, {**reply, **state.metadata}, state.headers)

    return Handler


@contextmanager
def serve_stub(state: StubState) -> Iterator[str]:
    """Yields the base URL (http://127.0.0.1:PORT) while the server runs."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
