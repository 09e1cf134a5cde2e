"""The HTTP keep-alive race behind the gateway soak's status-less requests (issue #27), on loopback.

A uvicorn server as the gateway runs it (asyncio loop, httptools) with keep-alive K, and httpx
clients with `keepalive_expiry` E, each on its own connection: one POST, an idle wait just short
of E (the client still trusts its connection), a second POST on the same connection. Both event
loops are kept busy in `--stall` ms slices (time.sleep on the loop: no CPU), as on the soak's
2 shared cores. With K == E (uvicorn's 5 s, httpx's 5 s) a reuse can land after the server's
idle timer fired but before its socket is closed (asyncio closes it one loop iteration later):
the request is dropped unread, the kernel resets the connection, the client gets a ReadError (or
RemoteProtocolError) and the server logs nothing. With K > E the client always retires the
connection first. Prints one line per setting: reuses, failures by exception type.

    PYTHONPATH=src python benchmarks/soak/keepalive_race.py --keep-alive 1 --expiry 1 --trials 200
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import random
import threading
import time
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI


def app() -> FastAPI:
    api = FastAPI()

    @api.post("/v1/embeddings")
    async def embed(body: dict[str, Any]) -> dict[str, Any]:
        return {"object": "list", "data": [{"index": 0, "embedding": [0.0]}]}

    return api


async def busy(stall_s: float) -> None:
    """A loop that is never idle: each iteration spends `stall_s` in one callback."""
    while True:
        time.sleep(stall_s)
        await asyncio.sleep(0)


def serve(
    port: int, keep_alive: float, stall_s: float, loop: str, started: threading.Event
) -> uvicorn.Server:
    # uvicorn types timeout_keep_alive as int; loop.call_later takes any float.
    config = uvicorn.Config(app(), host="127.0.0.1", port=port, loop=loop, log_level="warning")
    config.timeout_keep_alive = keep_alive  # type: ignore[assignment]
    server = uvicorn.Server(config)

    async def run() -> None:
        stall = asyncio.create_task(busy(stall_s))
        started.set()
        await server.serve()
        stall.cancel()

    def thread() -> None:
        # The loop uvicorn.run would pick: asyncio as in the gateway (asyncio.run), uvloop as in `serve`.
        factory = config.get_loop_factory()
        (factory or asyncio.new_event_loop)().run_until_complete(run())

    threading.Thread(target=thread, daemon=True).start()
    return server


async def trial(url: str, expiry: float, idle: float, outcomes: collections.Counter[str]) -> None:
    limits = httpx.Limits(max_connections=1, keepalive_expiry=expiry)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=10) as client:
        await client.post("/v1/embeddings", json={"input": "a"})
        await asyncio.sleep(idle)
        try:
            r = await client.post("/v1/embeddings", json={"input": "b"})
            outcomes[str(r.status_code)] += 1
        except httpx.HTTPError as e:
            outcomes[type(e).__name__] += 1


async def clients(url: str, args: argparse.Namespace) -> collections.Counter[str]:
    outcomes: collections.Counter[str] = collections.Counter()
    rng = random.Random(0)
    stall = asyncio.create_task(busy(args.client_stall / 1000))
    # Idle times spread over the last `--window` s before the client's own expiry.
    idles = [args.expiry - rng.uniform(0.0, args.window) for _ in range(args.trials)]
    await asyncio.gather(*(trial(url, args.expiry, idle, outcomes) for idle in idles))
    stall.cancel()
    return outcomes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keep-alive", type=float, default=1.0, help="server keep-alive K, s")
    ap.add_argument("--expiry", type=float, default=1.0, help="client keepalive_expiry E, s")
    ap.add_argument("--trials", type=int, default=200, help="connections, one reuse each")
    ap.add_argument("--window", type=float, default=0.1, help="reuse within this many s before E")
    ap.add_argument("--server-stall", type=float, default=0.0, help="ms per busy server loop iteration")
    ap.add_argument("--client-stall", type=float, default=20.0, help="ms per busy client loop iteration")
    ap.add_argument("--loop", choices=["asyncio", "uvloop"], default="asyncio", help="server event loop")
    ap.add_argument("--port", type=int, default=18931)
    args = ap.parse_args()
    started = threading.Event()
    server = serve(args.port, args.keep_alive, args.server_stall / 1000, args.loop, started)
    started.wait()
    while not server.started:
        time.sleep(0.05)
    outcomes = asyncio.run(clients(f"http://127.0.0.1:{args.port}", args))
    server.should_exit = True
    failed = sum(n for k, n in outcomes.items() if not k.isdigit())
    print(
        f"{args.loop} server keep-alive {args.keep_alive:g} s, client expiry {args.expiry:g} s, "
        f"busy loops: server {args.server_stall:g} ms, client {args.client_stall:g} ms: "
        f"{args.trials} reuses, {failed} without a status {dict(sorted(outcomes.items()))}"
    )


if __name__ == "__main__":
    main()
