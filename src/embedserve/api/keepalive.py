"""Connection timing shared by the server, the gateway and their clients (no imports: the CLIs
read it for --help).

A keep-alive connection is closed by whichever side's idle timer fires first. When the server's
fires as the client reuses the connection, the request is dropped unread and the client gets a
reset with no status; an HTTP client never resends a POST on its own
(benchmarks/soak/keepalive_race.py reproduces it: uvicorn's 5 s against httpx's 5 s). So the side
that sends must always give up first:

    client idle expiry  <  server keep-alive                 (client -> server or gateway)
    gateway upstream expiry (UPSTREAM_KEEPALIVE_EXPIRY_S)  <  a pool's keep-alive
    longest Retry-After (MAX_RETRY_AFTER_S)  <  keep-alive   (a client that waits as told and
                                                              reuses its connection)
"""

from __future__ import annotations

# The longest Retry-After the server and the gateway send (seconds).
MAX_RETRY_AFTER_S = 60
# Idle keep-alive connections of the server and the gateway close after this (seconds): above
# the usual clients' idle expiry (httpx and the OpenAI clients: 5 s; aiohttp: 15 s; load
# balancers: 60 s) and MAX_RETRY_AFTER_S. nginx's default.
KEEP_ALIVE_S = 75.0
# The gateway drops an idle pooled connection to a pool after this (seconds): below uvicorn's
# default keep-alive (5 s), so even a pool run with it never closes a connection being reused.
UPSTREAM_KEEPALIVE_EXPIRY_S = 4.0
