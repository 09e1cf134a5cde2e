"""The engine's memory over many short requests: RSS, Python objects, the C heap and the engine's
own per-request structures after each block, to tell a leak from a cache or a heap's high water.

    python benchmarks/engine_rss.py --requests 10000 --blocks 5 [--idle 0] [--model DIR]
        [--concurrency 64] [--words 25 110] [--tracemalloc] [--options key=value ...]

Each block sends `--requests` new texts (a few to ~100 tokens, or `--words` least most words)
through `Engine.embed_async`, `--concurrency` calls in flight, then waits `--idle` seconds (1.5:
the loop's idle trim runs; 0: never idle, as under a continuous load) and prints requests/s and
CPU-ms per request (all threads), RSS at the block's end and its peak (VmHWM, reset per block),
gc's object count and the types that grew, glibc's heap bytes in use and free over every arena
(mallinfo2), the sizes of the engine's per-request structures (all 0: nothing retained), and
with `--tracemalloc` the Python lines that grew most (slower). A leak grows the bytes in use by
about the same every block; a cache grows them up to its bound; a fragmenting heap grows the
free bytes (resident until trimmed) while the bytes in use stay flat. ONEDNN_VERBOSE=1 lists
every oneDNN call with its shape (distinct row counts: `sort -u`).

Measured (all-MiniLM-L6-v2, 64 in flight, 2 shared cores; requests/s are +-5% there):
- before (a oneDNN call at every step's own row count): Python objects +0 per block and every
  per-request structure empty, but the heap's bytes in use +390 MB over the first 10,000
  requests: oneDNN's and ideep's primitive caches (1,024 each, ~0.4 MB per primitive, one per
  row count and projection, GELU included), new ones at almost every step. With 1.5 s idle
  between blocks RSS 451 -> 846, 869, 871, 869, 870 MB (5 x 10,000); with none the primitives'
  churn among the activations fragmented the heap: 577 -> 1232, 1510, 1846, 1965, 2117 MB, its
  free bytes 420 -> 1268 MB, bytes in use flat at 630.
- after (models/linear.py `padded_rows`: 16 row counts per octave): never idle, 544 -> 769,
  789, 799, 802, 807 MB, free bytes ~200 MB throughout; one request at a time of 25-110 words:
  66-68 -> 65-69 req/s, RSS +189 -> +61 MB.
- side by side (2026-12-05, quiet box, `--requests 5000 --blocks 3 --idle 0`, base and this
  tree alternating, two runs each): RSS after the blocks, base 1079, 1305, 1616 and 1025, 1311,
  1510 MB (still growing); this 701, 794, 794 and 706, 727, 728 MB (flat from the second block).
  182-198 req/s both (10.0-10.9 CPU-ms per request each): the padding rows cost no measurable
  time. SmolLM2-135M (`benchmarks/ab_source.py --workloads 100x30,700x6,4096`, same run):
  this / base 1.055, 1.046, 1.018 tok/s, vectors bit-equal (max difference 0).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import ctypes.util
import gc
import random
import time
import tracemalloc
from collections import Counter
from pathlib import Path
from typing import Any

from embedserve.engine.engine import Engine
from embedserve.engine.options import EngineOptions

WORDS = ["the", "of", "engine", "batch", "token", "model", "vector", "query", "document", "server", "pool"]
_STATUS = Path("/proc/self/status")


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
                 "fordblks", "keepcost")]  # fmt: skip


def status_mb(key: str) -> float:
    """A /proc/self/status memory line (VmRSS, VmHWM) in MB; 0 where there is none."""
    for line in _STATUS.read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    return 0.0


def reset_peak() -> None:
    """Start VmHWM over from the current RSS (Linux 4.0+; nothing where refused)."""
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")


def heap_mb() -> tuple[float, float]:
    """glibc's (bytes in use, bytes free) over every arena, in MB; zeros elsewhere."""
    try:
        fn = ctypes.CDLL(ctypes.util.find_library("c")).mallinfo2
    except (OSError, AttributeError):
        return 0.0, 0.0
    fn.restype = _Mallinfo2
    info = fn()
    return (info.uordblks + info.hblkhd) / 2**20, info.fordblks / 2**20


def texts(n: int, seed: int, words: tuple[int, int] | None = None) -> list[str]:
    """`n` texts unseen by other seeds: a few to ~100 tokens, or `words` = (least, most) words."""
    rng = random.Random(seed)

    def count() -> int:
        return rng.choice((2, 5, 10, 20, 40, 60, 90)) if words is None else rng.randint(*words)

    return [f"{seed}-{i} " + " ".join(rng.choices(WORDS, k=count())) for i in range(n)]


def type_counts() -> Counter[str]:
    return Counter(type(o).__name__ for o in gc.get_objects())


def engine_sizes(engine: Engine) -> dict[str, int]:
    """Every per-request structure of the loop, core, scheduler and KV cache."""
    loop = engine._loop
    core = loop.core
    sched = core.scheduler
    kv = sched.kv
    return {
        "futures": len(loop._futures),
        "requests": len(core.requests),
        "waiting": len(sched.waiting),
        "running": len(sched.running),
        "tables": len(kv._tables),
        "registered": len(kv._registered),
        "cached_blocks": len(kv.pool.by_hash),
        "held_blocks": len(kv.pool._refs),
    }


async def run_block(engine: Engine, items: list[str], concurrency: int, per_call: int) -> None:
    calls = [items[i : i + per_call] for i in range(0, len(items), per_call)]
    for w in range(0, len(calls), concurrency):
        await asyncio.gather(*(engine.embed_async(c) for c in calls[w : w + concurrency]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=None, help="model directory (default: all-MiniLM-L6-v2)")
    ap.add_argument("--requests", type=int, default=10_000, help="texts per block")
    ap.add_argument("--blocks", type=int, default=5)
    ap.add_argument("--concurrency", type=int, default=64, help="embed_async calls in flight")
    ap.add_argument("--per-call", type=int, default=1, help="texts per embed_async call")
    ap.add_argument("--words", type=int, nargs=2, default=None, help="words per text: least, most")
    ap.add_argument("--idle", type=float, default=1.5, help="seconds idle after a block (loop's trim)")
    ap.add_argument("--tracemalloc", action="store_true", help="tracemalloc's top growth per block")
    ap.add_argument("--options", nargs="*", default=[], help="engine options, key=value")
    args = ap.parse_args()
    if args.model is None:
        from embedserve.models.default import DEFAULT_MODEL_NAME, model_argument

        args.model = Path(model_argument(DEFAULT_MODEL_NAME))
    options = EngineOptions.from_mapping(
        dict(kv.split("=", 1) for kv in args.options), where="--options", surface="bench"
    )
    start_rss = status_mb("VmRSS")
    engine = Engine.from_pretrained(args.model, options)
    asyncio.run(run_block(engine, texts(256, -1), args.concurrency, args.per_call))  # warm-up
    time.sleep(args.idle)
    gc.collect()
    base_rss, prev_types = status_mb("VmRSS"), type_counts()
    used, free = heap_mb()
    print(f"before load {start_rss:.0f} MB, after load + warm-up {base_rss:.0f} MB", flush=True)
    print(f"  C heap: {used:.0f} MB in use, {free:.0f} MB free", flush=True)
    if args.tracemalloc:
        tracemalloc.start(4)
    snap: Any = tracemalloc.take_snapshot() if args.tracemalloc else None
    prev_rss = base_rss
    for b in range(args.blocks):
        items = texts(args.requests, b, args.words)
        reset_peak()
        began, cpu = time.perf_counter(), time.process_time()
        asyncio.run(run_block(engine, items, args.concurrency, args.per_call))
        took, cpu = time.perf_counter() - began, time.process_time() - cpu
        peak = status_mb("VmHWM")
        time.sleep(args.idle)
        gc.collect()
        rss, types = status_mb("VmRSS"), type_counts()
        grown = (types - prev_types).most_common(4)
        print(
            f"block {b}: {args.requests} requests {args.requests / took:.0f} req/s "
            f"({cpu / args.requests * 1e3:.1f} CPU-ms each), RSS {rss:.0f} MB "
            f"({rss - prev_rss:+.0f}, {rss - base_rss:+.0f} total), peak {peak:.0f}, "
            f"objects {sum(types.values())} "
            f"({sum(types.values()) - sum(prev_types.values()):+d}), grown {grown}",
            flush=True,
        )
        used, free = heap_mb()
        print(f"  C heap: {used:.0f} MB in use, {free:.0f} MB free; {engine_sizes(engine)}", flush=True)
        if args.tracemalloc:
            now = tracemalloc.take_snapshot()
            for stat in now.compare_to(snap, "lineno")[:5]:
                print(f"  {stat}", flush=True)
            snap = now
        prev_rss, prev_types = rss, types
    engine.close()


if __name__ == "__main__":
    main()
