"""The asyncio API: concurrent callers, and cancellation that frees the KV cache."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

import numpy as np

from embedserve import Engine
from tests.helpers.reference import cosine, hf_embed_ids, random_ids


def test_concurrent_async_callers_get_their_own_vectors(qwen3_dir: Path) -> None:
    seqs = [random_ids(n, seed=n) for n in (40, 900, 3, 2000, 150)]
    ref = hf_embed_ids(qwen3_dir, seqs)

    async def main(engine: Engine) -> list[np.ndarray]:
        return await asyncio.gather(
            *(engine.embed_async([s], priority="batch" if i % 2 else "online") for i, s in enumerate(seqs))
        )

    with Engine.from_pretrained(qwen3_dir, max_num_batched_tokens=256) as engine:
        got = np.concatenate(asyncio.run(main(engine)))
    assert cosine(got, ref).min() >= 0.99999


def test_cancelled_caller_frees_its_blocks_and_engine_keeps_serving(qwen3_dir: Path) -> None:
    async def main(engine: Engine) -> None:
        task = asyncio.create_task(engine.embed_async([random_ids(8000, seed=1)] * 4))
        while engine.stats()["kv_blocks_used"] == 0:
            await asyncio.sleep(0.001)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        deadline = time.monotonic() + 10
        while engine.stats()["num_running"] + engine.stats()["num_waiting"] and time.monotonic() < deadline:
            await asyncio.sleep(0.01)

    # chunked path (the KV cache) on purpose: layer-major inputs hold no blocks
    with Engine.from_pretrained(
        qwen3_dir, max_num_batched_tokens=64, max_model_len=8192, layer_major_tokens=0
    ) as engine:
        asyncio.run(main(engine))
        stats = engine.stats()
        assert stats["num_running"] == stats["num_waiting"] == stats["kv_blocks_used"] == 0
        # Far fewer tokens computed than the 32,000 submitted: the work really stopped.
        assert stats["tokens_computed"] < 16_000
        seqs = [random_ids(100, seed=2)]
        assert cosine(engine.embed(seqs), hf_embed_ids(qwen3_dir, seqs))[0] >= 0.99999
