"""RSS of one `embedserve serve` after successive blocks of the *same* requests.

    PYTHONPATH=src:. python benchmarks/soak/rss_probe.py --length 0 --requests 80 --blocks 6

A leak grows by about the same amount every block; a cache keyed by shapes or an allocator's
high-water mark grows less and less as the same requests repeat. `--length 0` draws lengths in
16..6,015 tokens (the same ones every block), else every request has `--length` tokens.
Set ONEDNN_PRIMITIVE_CACHE_CAPACITY in the environment to see oneDNN's per-shape cache's share.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
import psutil  # noqa: E402

from benchmarks.soak.run import LONG_MAX, tiny_model  # noqa: E402
from tests.helpers.server_process import start_server, words  # noqa: E402


def length_of(i: int, length: int) -> int:
    return length if length > 0 else 16 + (i * 7919) % 6000


async def block(url: str, requests: int, length: int, clients: int) -> None:
    todo = iter(range(requests))
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:

        async def one() -> None:
            for i in todo:
                n = length_of(i, length)
                body = {"input": words(n - 1, i), "priority": "batch" if n > 1024 else "online"}
                r = await client.post("/v1/embeddings", json=body)
                r.raise_for_status()

        await asyncio.gather(*(one() for _ in range(clients)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--length", type=int, default=0)
    ap.add_argument("--requests", type=int, default=80)
    ap.add_argument("--blocks", type=int, default=6)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--model", type=Path, default=Path("/tmp/embedserve-soak-model"))
    ap.add_argument("--log-dir", type=Path, default=Path("/tmp"))
    args = ap.parse_args()
    server = start_server(tiny_model(args.model), args.log_dir, "--max-model-len", str(LONG_MAX))
    try:
        server.wait_ready(180)
        proc = psutil.Process(server.proc.pid)
        print(f"ready: RSS {proc.memory_info().rss / 2**20:.0f} MiB", flush=True)
        for b in range(args.blocks):
            start = time.monotonic()
            asyncio.run(block(server.base_url, args.requests, args.length, args.clients))
            time.sleep(3)
            rss = proc.memory_info().rss / 2**20
            took, fds = time.monotonic() - start, proc.num_fds()
            print(f"block {b}: {args.requests} requests in {took:.0f} s -> RSS {rss:.0f} MiB, fds {fds}")
    finally:
        server.terminate()


if __name__ == "__main__":
    main()
