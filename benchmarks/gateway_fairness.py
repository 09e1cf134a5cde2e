"""Fair share by tokens through a real gateway and pool (#46): two tenants flood batch work at a
pool with `max_inflight_tokens`, a third sends online queries; tokens served per tenant (from
the gateway's per-tenant metrics) and the online tenant's latency alone and under the flood.

    python benchmarks/gateway_fairness.py [--model DIR] [--seconds 20] [--weights 3 1]
        [--sizes 40 40] [--inputs 4 4] [--inflight 1024] [--clients 8] [--rate 5]

One `embedserve serve` (the pool) and one `embedserve gateway` on loopback; tenants `a` and `b`
(batch only, the given weights, each `--clients` closed-loop clients sending `--inputs` inputs of
`--sizes` words a request, 4 and 4 by default) and `c` (online only, Poisson queries at `--rate`/s).

Measured 2026-12-05 (2-core AMD EPYC, everything on the same two cores, MiniLM, 20 s):
- `--weights 3 1`: tokens served 47,040 : 16,968 (2.77 : 1); c's p99 60.2 -> 63.8 ms (1.06x).
- `--weights 1 1 --sizes 180 8`: 48,048 : 18,640 (2.58 : 1); c's p99 63.9 -> 56.3 ms.
- the same with `--clients 32`: 44,408 : 22,400 (1.98 : 1); c's p99 50.2 -> 103.5 ms.
  The small-input tenant cannot keep parts waiting at the gate (docs/gateway.md).
Measured 2026-12-05 (2-core Intel Xeon, AVX-512 + AMX): `--weights 1 1 --sizes 180 8 --inputs 4 32`
(b indexes in bulk: 32 inputs a request): 19,656 : 17,280 tokens (1.14 : 1; b's requests carry
320 tokens against a's 728, so request fairness would give 2.27 : 1).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import yaml
from batch_interference import pct as _pct
from batch_interference import poisson

WORDS = ["the", "of", "engine", "batch", "token", "model", "vector", "query", "document", "server", "pool"]


def _wait_ready(url: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 300
    while True:
        try:
            if httpx.get(f"{url}/health/ready", timeout=5).status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert proc.poll() is None and time.monotonic() < deadline, f"{url} did not start"
        time.sleep(0.5)


async def _flood(base: str, key: str, words: int, inputs: int, clients: int, until: float) -> int:
    """Closed-loop batch requests until `until`; returns how many were answered."""
    done = 0
    rng = random.Random(key)
    async with httpx.AsyncClient(base_url=base, timeout=300, headers={"Authorization": f"Bearer {key}"}) as c:

        async def client() -> None:
            nonlocal done
            while time.monotonic() < until:
                texts = [" ".join(rng.choices(WORDS, k=words)) for _ in range(inputs)]
                r = await c.post("/v1/embeddings", json={"input": texts, "priority": "batch"})
                if r.status_code == 200:
                    done += 1
                else:
                    await asyncio.sleep(float(r.headers.get("retry-after", "1")))

        await asyncio.gather(*(client() for _ in range(clients)))
    return done


async def _queries(base: str, key: str, rate: float, seconds: float) -> list[float]:
    rng = random.Random(7)
    latencies: list[float] = []
    async with httpx.AsyncClient(base_url=base, timeout=120, headers={"Authorization": f"Bearer {key}"}) as c:

        async def one(i: int) -> None:
            start = time.perf_counter()
            r = await c.post(
                "/v1/embeddings", json={"input": f"query {i} " + " ".join(rng.choices(WORDS, k=8))}
            )
            r.raise_for_status()
            latencies.append((time.perf_counter() - start) * 1000)

        await poisson(rate, seconds, rng, one)
    return latencies


def _tokens(base: str) -> dict[str, float]:
    text = httpx.get(f"{base}/metrics", headers={"Authorization": "Bearer ops"}).text
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("embedserve_gateway_tenant_tokens_total{"):
            tenant = line.split('tenant="')[1].split('"')[0]
            out[tenant] = out.get(tenant, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="all-MiniLM-L6-v2")
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--weights", type=float, nargs=2, default=[3.0, 1.0])
    p.add_argument("--sizes", type=int, nargs=2, default=[40, 40], help="words per input of a and b")
    p.add_argument("--inputs", type=int, nargs=2, default=[4, 4], help="inputs per request of a and b")
    p.add_argument("--inflight", type=int, default=1024, help="the pool's max_inflight_tokens")
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--rate", type=float, default=5.0)
    a = p.parse_args()
    env = {**os.environ, "A_KEYS": "ka", "B_KEYS": "kb", "C_KEYS": "kc"}
    with tempfile.TemporaryDirectory() as d:
        config = Path(d) / "pools.yaml"
        tenants = {
            "a": {"api_keys_env": "A_KEYS", "classes": ["batch"], "weight": a.weights[0]},
            "b": {"api_keys_env": "B_KEYS", "classes": ["batch"], "weight": a.weights[1]},
            "c": {"api_keys_env": "C_KEYS", "classes": ["online"]},
        }
        pools = {
            "all": {
                "max_tokens": 256,
                "upstreams": ["http://127.0.0.1:8301"],
                "max_inflight_tokens": a.inflight,
            }
        }
        routes = [{"class": "online", "order": ["all"]}, {"class": "batch", "order": ["all"]}]
        config.write_text(
            yaml.safe_dump({"model": a.model, "pools": pools, "routes": routes, "tenants": tenants})
        )
        server = subprocess.Popen(
            [sys.executable, "-m", "embedserve", "serve", "--model", a.model, "--port", "8301"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
        )  # fmt: skip
        gateway = None
        try:
            _wait_ready("http://127.0.0.1:8301", server)
            gateway = subprocess.Popen(
                [sys.executable, "-m", "embedserve", "gateway", "--config", str(config), "--port", "8300",
                 "--api-key", "ops"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
            )  # fmt: skip
            base = "http://127.0.0.1:8300"
            _wait_ready(base, gateway)
            alone = asyncio.run(_queries(base, "kc", a.rate, a.seconds))
            before = _tokens(base)

            async def contended() -> tuple[list[float], int, int]:
                until = time.monotonic() + a.seconds
                flood_a = asyncio.create_task(_flood(base, "ka", a.sizes[0], a.inputs[0], a.clients, until))
                flood_b = asyncio.create_task(_flood(base, "kb", a.sizes[1], a.inputs[1], a.clients, until))
                await asyncio.sleep(2)  # both backlogs built
                lat = await _queries(base, "kc", a.rate, a.seconds - 4)
                return lat, await flood_a, await flood_b

            under, n_a, n_b = asyncio.run(contended())
            after = _tokens(base)
            served = {t: after.get(t, 0.0) - before.get(t, 0.0) for t in ("a", "b")}
            ratio = served["a"] / max(served["b"], 1.0)
            print(
                f"weights {a.weights[0]:g}:{a.weights[1]:g}, {a.inputs[0]} inputs of {a.sizes[0]} words vs "
                f"{a.inputs[1]} of {a.sizes[1]} a request, "
                f"max_inflight_tokens {a.inflight}, {a.clients} clients each, {a.seconds:g} s\n"
                f"  tokens served a {served['a']:.0f} ({n_a} requests), "
                f"b {served['b']:.0f} ({n_b} requests): "
                f"{ratio:.2f} : 1\n"
                f"  online tenant c: p50 {_pct(alone, 0.5):.1f} -> {_pct(under, 0.5):.1f} ms, "
                f"p99 {_pct(alone, 0.99):.1f} -> {_pct(under, 0.99):.1f} ms "
                f"({_pct(under, 0.99) / _pct(alone, 0.99):.2f}x; {len(alone)} / {len(under)} queries)"
            )
        finally:
            for proc in (gateway, server):
                if proc is not None:
                    proc.terminate()
                    proc.wait(60)


if __name__ == "__main__":
    main()
