"""A minimal OpenAI-compatible embeddings server over llama-cpp-python, for benchmarks only.

llama-cpp-python's own server does not expose the pooling type, so a decoder GGUF would return
per-token vectors there. This wrapper sets LAST (or MEAN / CLS) pooling explicitly, as the
recipe in ../shared/PEERS.md does. One Llama context serves requests one at a time (FIFO under a
lock), which is how llama.cpp embeds through its Python binding. Runs in the peer's own venv:

    python llamacpp_server.py --model FILE.gguf --port 8012 [--pooling last] [--n-ctx 16384]

It embeds each text as given: for Qwen GGUFs, which rely on an appended <|endoftext|>, vectors
will differ from the reference (the bench's cosine column shows it).
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import llama_cpp

POOLING = {
    "last": llama_cpp.LLAMA_POOLING_TYPE_LAST,
    "mean": llama_cpp.LLAMA_POOLING_TYPE_MEAN,
    "cls": llama_cpp.LLAMA_POOLING_TYPE_CLS,
}


def build_handler(llm: llama_cpp.Llama, name: str) -> type[BaseHTTPRequestHandler]:
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def _send(self, code: int, payload: object, headers: dict[str, str] | None = None) -> None:
            data = json.dumps(payload).encode()
            self.send_response(code)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path.rstrip("/") in ("/v1/models", "/models"):
                self._send(200, {"object": "list", "data": [{"id": name, "object": "model"}]})
            else:
                self._send(404, {"error": {"message": f"no route {self.path}"}})

        def do_POST(self) -> None:
            if self.path.rstrip("/") not in ("/v1/embeddings", "/embeddings"):
                self._send(404, {"error": {"message": f"no route {self.path}"}})
                return
            try:
                body = json.loads(self.rfile.read(int(self.headers.get("content-length", "0"))))
                texts = body["input"] if isinstance(body["input"], list) else [body["input"]]
                if not texts or not all(isinstance(t, str) and t for t in texts):
                    raise ValueError("input must be a non-empty string or list of strings")
            except (ValueError, KeyError, TypeError) as e:
                self._send(400, {"error": {"message": str(e)}})
                return
            arrived = time.perf_counter()
            with lock:  # one context, one request at a time
                queued_ms = (time.perf_counter() - arrived) * 1000
                try:
                    vectors = llm.embed(texts, normalize=True)
                except Exception as e:  # report, keep serving
                    self._send(500, {"error": {"message": f"{type(e).__name__}: {e}"}})
                    return
            data = [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(vectors)]
            n = sum(len(llm.tokenize(t.encode())) for t in texts)
            payload = {"object": "list", "data": data, "model": name,
                       "usage": {"prompt_tokens": n, "total_tokens": n}}  # fmt: skip
            self._send(200, payload, {"x-queue-time": f"{queued_ms:.3f}"})

    return Handler


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", required=True, help="GGUF file")
    p.add_argument("--port", type=int, default=8012)
    p.add_argument("--pooling", choices=sorted(POOLING), default="last")
    p.add_argument("--n-ctx", type=int, default=16384)
    p.add_argument("--n-ubatch", type=int, default=2048)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--served-model-name", default="peer")
    args = p.parse_args()
    llm = llama_cpp.Llama(
        model_path=args.model, embedding=True, pooling_type=POOLING[args.pooling], n_ctx=args.n_ctx,
        n_batch=args.n_ctx, n_ubatch=args.n_ubatch, n_threads=args.threads, flash_attn=True, verbose=False,
    )  # fmt: skip
    server = ThreadingHTTPServer(("127.0.0.1", args.port), build_handler(llm, args.served_model_name))
    server.serve_forever()


if __name__ == "__main__":
    main()
