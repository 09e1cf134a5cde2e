"""The gateway's own cost per request: the same requests to one upstream, direct vs through the gateway.

    python benchmarks/gateway/overhead.py --direct http://127.0.0.1:8001 --gateway http://127.0.0.1:8080

The gateway must route everything to `--direct` (one pool with that upstream). Direct and
gateway calls alternate in small rounds so that load from other work on the machine hits both
alike. Reports client-side p50/p95 for each path, their difference, and the gateway's own
measure (x-total-time - x-upstream-time headers: counting, routing, JSON in and out).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import httpx

ROUND = 20


def _pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


async def _timed(
    client: httpx.AsyncClient, url: str, body: dict[str, object], out: list[float]
) -> httpx.Response:
    t = time.perf_counter()
    r = await client.post(f"{url}/v1/embeddings", json=body)
    out.append(time.perf_counter() - t)
    r.raise_for_status()
    return r


async def _run(direct: str, gateway: str, inputs: int, concurrency: int, requests: int) -> dict[str, float]:
    lat: dict[str, list[float]] = {"direct": [], "gateway": []}
    own: list[float] = []
    limits = httpx.Limits(max_connections=2 * concurrency, max_keepalive_connections=2 * concurrency)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:

        async def one(i: int, path: str) -> None:
            body: dict[str, object] = {
                "input": [f"short query number {i} item {k} about attention" for k in range(inputs)]
            }
            r = await _timed(client, direct if path == "direct" else gateway, body, lat[path])
            if path == "gateway":
                own.append((float(r.headers["x-total-time"]) - float(r.headers["x-upstream-time"])) / 1000)

        async def round_of(path: str, ids: list[int]) -> None:
            queue = iter(ids)  # shared: each id is taken by one of the workers

            async def worker() -> None:
                for i in queue:
                    await one(i, path)

            await asyncio.gather(*(worker() for _ in range(concurrency)))

        for path in ("direct", "gateway"):  # warm connections, caches and the first-request paths
            await round_of(path, [-1] * concurrency)
        for values in (*lat.values(), own):
            values.clear()
        for start in range(0, requests, ROUND):
            for path in ("direct", "gateway"):
                await round_of(path, list(range(start, min(start + ROUND, requests))))
    d, g = lat["direct"], lat["gateway"]
    return {
        "direct_p50": statistics.median(d),
        "direct_p95": _pct(d, 0.95),
        "gateway_p50": statistics.median(g),
        "gateway_p95": _pct(g, 0.95),
        "own_p50": statistics.median(own),
        "own_p95": _pct(own, 0.95),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--direct", required=True, help="base URL of the upstream")
    ap.add_argument("--gateway", required=True, help="base URL of a gateway whose only pool is --direct")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--inputs", type=int, nargs="+", default=[1, 8], help="inputs per request")
    ap.add_argument("--requests", type=int, default=200, help="requests per path and cell")
    args = ap.parse_args()
    print(
        "| inputs/request | concurrency | direct p50 / p95 (ms) | gateway p50 / p95 (ms) | added p50 (ms) "
        "| gateway's own p50 / p95 (ms) |"
    )
    print("|---|---|---|---|---|---|")
    for n in args.inputs:
        for c in args.concurrency:
            r = {
                k: 1000 * v
                for k, v in asyncio.run(_run(args.direct, args.gateway, n, c, args.requests)).items()
            }
            print(
                f"| {n} | {c} | {r['direct_p50']:.2f} / {r['direct_p95']:.2f} | {r['gateway_p50']:.2f} / "
                f"{r['gateway_p95']:.2f} | {r['gateway_p50'] - r['direct_p50']:+.2f} | "
                f"{r['own_p50']:.2f} / {r['own_p95']:.2f} |"
            )


if __name__ == "__main__":
    main()
