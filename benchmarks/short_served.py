"""Short-query requests/s through a served OpenAI-compatible endpoint, with the `openai`
client's own request shape (it asks for base64 vectors and decodes them), closed loop.

    python benchmarks/short_served.py --url http://127.0.0.1:8011/v1 --model NAME \
        --tokenizer DIR --tokens 16 --concurrency 1,32 --requests 200 [--pid SERVER_PID]
    python benchmarks/short_served.py --tokenizer DIR --rounds 3 \
        --target ours=http://127.0.0.1:8021/v1,local,PID --target vllm=http://127.0.0.1:8011/v1,peer,PID

With several targets the cells alternate (round, concurrency, target), so a noisy machine
slows each about equally; the last lines give per-target medians and ratios to the first.
Before each cell the client waits until every target with a PID is quiet (`--settle`): a
server's threads may keep spinning on both cores for a second or more after its own cell
(vLLM's: 0.8 CPU-seconds in the 3 s after a cell), which slowed whichever target came next.

Each query is a different `--tokens`-token text (words that are single tokens in the
tokenizer), after `--prefix` if given (an instruction every query shares). Reported per
concurrency: requests/s, p50 / p99 latency, and with `--pid` the
server's CPU seconds per request (its process tree), which holds up on a shared machine.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from openai import AsyncOpenAI
from tokenizers import Tokenizer

from embedserve.bench.cputime import tree_cpu, wait_quiet


def queries(tokenizer_dir: str, tokens: int, count: int) -> list[str]:
    tok = Tokenizer.from_file(f"{tokenizer_dir}/tokenizer.json")
    vocab = [w for w in tok.get_vocab() if w.isalpha() and len(w) > 3][:5000]
    texts = []
    for i in range(count):
        picked = [vocab[(i * 7919 + j * 104729) % len(vocab)] for j in range(tokens * 2)]
        text = " ".join(picked)
        ids = tok.encode(text, add_special_tokens=False).ids[:tokens]
        texts.append(tok.decode(ids))
    return texts


def server_cpu(pid: int | None) -> float:
    return 0.0 if pid is None else tree_cpu(pid)


async def cell(client: AsyncOpenAI, model: str, texts: list[str], concurrency: int) -> list[float]:
    latencies: list[float] = []
    it = iter(texts)

    async def worker() -> None:
        for text in it:
            t = time.perf_counter()
            r = await client.embeddings.create(model=model, input=text)
            assert len(r.data[0].embedding) > 0
            latencies.append(time.perf_counter() - t)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return latencies


def parse_target(spec: str) -> tuple[str, str, str, int | None]:
    """NAME=URL,MODEL[,PID]"""
    name, _, rest = spec.partition("=")
    parts = rest.split(",")
    if not name or len(parts) not in (2, 3):
        raise SystemExit(f"--target {spec!r}: expected NAME=URL,MODEL[,PID]")
    return name, parts[0], parts[1], int(parts[2]) if len(parts) == 3 else None


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", help="one endpoint (with --model, --pid); or use --target")
    p.add_argument("--model")
    p.add_argument("--pid", type=int)
    p.add_argument("--target", action="append", default=[], help="NAME=URL,MODEL[,PID]; repeatable")
    p.add_argument("--tokenizer", required=True)
    p.add_argument("--tokens", type=int, default=16)
    p.add_argument(
        "--prefix",
        default="",
        help="text put before every query, as a client sends an instruction (e.g. Qwen3-Embedding's "
        "query instruction: the prefix caching case of issue #48)",
    )
    p.add_argument("--concurrency", default="1,32")
    p.add_argument("--requests", type=int, default=200)
    p.add_argument("--rounds", type=int, default=1, help="alternate the targets this many times")
    p.add_argument(
        "--settle", type=float, default=10.0, help="s to wait at most for quiet servers before a cell"
    )
    args = p.parse_args()
    targets = [parse_target(t) for t in args.target]
    if args.url:
        targets.insert(0, ("server", args.url, args.model or "", args.pid))
    if not targets:
        raise SystemExit("give --url and --model, or one or more --target")
    concurrencies = [int(x) for x in args.concurrency.split(",")]
    # Every cell gets texts no cell saw before: a server caching prefixes or results must not
    # be measured on repeats of the last cell's queries.
    cells = args.rounds * len(concurrencies) * len(targets)
    pool = [args.prefix + t for t in queries(args.tokenizer, args.tokens, args.requests * cells + 10)]
    texts, fresh = pool[-10:], iter(range(cells))
    clients = {
        name: AsyncOpenAI(base_url=url, api_key="none", max_retries=0, timeout=600)
        for name, url, _, _ in targets
    }
    for name, _, model, _ in targets:
        await cell(clients[name], model, texts, 1)  # warm-up
    rates: dict[tuple[str, int], list[float]] = {}
    for r in range(args.rounds):
        for c in concurrencies:
            for name, _, model, pid in targets:
                wait_quiet([t[3] for t in targets if t[3] is not None], args.settle)  # no request in flight
                cpu, wall = server_cpu(pid), time.perf_counter()
                first = next(fresh) * args.requests
                lat = sorted(await cell(clients[name], model, pool[first : first + args.requests], c))
                wall, cpu = time.perf_counter() - wall, server_cpu(pid) - cpu
                rates.setdefault((name, c), []).append(len(lat) / wall)
                p99 = lat[min(len(lat) - 1, int(0.99 * len(lat)))]
                per = f", server {1000 * cpu / len(lat):.1f} CPU-ms/request" if pid else ""
                print(
                    f"round {r + 1} {name} concurrency {c}: {len(lat) / wall:.2f} req/s, "
                    f"p50 {1000 * statistics.median(lat):.1f} ms, p99 {1000 * p99:.1f} ms{per} "
                    f"({len(lat)} requests of {args.tokens} tokens)",
                    flush=True,
                )
    first = targets[0][0]
    for (name, c), values in rates.items():
        ratio = statistics.median(values) / statistics.median(rates[(first, c)])
        print(f"median {name} concurrency {c}: {statistics.median(values):.2f} req/s ({ratio:.2f}x {first})")


if __name__ == "__main__":
    asyncio.run(main())
