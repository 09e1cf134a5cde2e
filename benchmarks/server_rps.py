"""Requests/s of a running `embedserve serve` on short inputs, at several concurrencies.

    embedserve serve --model DIR --port 8000 &
    python benchmarks/server_rps.py --url http://127.0.0.1:8000 --concurrency 1 32

Each request embeds one short sentence. The client shares the machine with the server, so on
a small CPU the numbers include the client's own cost.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import httpx


async def _run(url: str, concurrency: int, requests: int, api_key: str | None) -> dict[str, float]:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    latencies: list[float] = []
    counter = iter(range(requests))
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)

    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=120, limits=limits) as client:

        async def worker() -> None:
            for i in counter:
                t = time.perf_counter()
                text = f"short query number {i} about attention"
                r = await client.post("/v1/embeddings", json={"input": text})
                r.raise_for_status()
                latencies.append(time.perf_counter() - t)

        await client.post("/v1/embeddings", json={"input": "warm the connection"}, timeout=120)
        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - start
    latencies.sort()
    return {
        "rps": requests / wall,
        "p50_ms": 1000 * statistics.median(latencies),
        "p99_ms": 1000 * latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 32])
    ap.add_argument("--requests", type=int, default=300, help="requests per concurrency level")
    ap.add_argument("--api-key", default=None)
    args = ap.parse_args()
    for c in args.concurrency:
        r = asyncio.run(_run(args.url, c, args.requests, args.api_key))
        latency = f"p50 {r['p50_ms']:6.1f} ms  p99 {r['p99_ms']:6.1f} ms"
        print(f"concurrency {c:3d}: {r['rps']:7.1f} req/s  {latency}")


if __name__ == "__main__":
    main()
