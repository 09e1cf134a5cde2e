"""The engine holds flat memory over many requests: nothing is kept per finished request, and
oneDNN meets a bounded set of row counts (models/linear.py `padded_rows`), so its per-shape
primitive caches stop growing instead of churning at every step (`benchmarks/engine_rss.py`)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from embedserve import Engine
from embedserve.models import linear
from embedserve.models.linear import Linear, SiluGateUp
from embedserve.models.row_padding import PAD_ABOVE, padded_rows
from tests.helpers.reference import random_ids
from tests.helpers.tiny_bert import build_encoder


def test_padded_rows_are_few_and_close() -> None:
    counts = range(1, 8193)
    padded = [padded_rows(m) for m in counts]
    assert all(p == m for m, p in zip(counts, padded, strict=True) if m <= PAD_ABOVE)
    assert all(m <= p < m * 17 / 16 for m, p in zip(counts, padded, strict=True))
    assert all(padded_rows(p) == p for p in padded)  # a padded count stays as it is
    assert len(set(padded[:2048])) <= 128  # 32 exact, then 16 per octave
    assert len(set(padded)) <= 160


def _exact(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """oneDNN's linear at the rows' own count."""
    return linear._POINTWISE(x, weight, bias, "none", [], "")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_padded_calls_give_the_exact_call_bits(dtype: torch.dtype) -> None:
    if not linear.onednn_gated_available(dtype):
        pytest.skip(f"oneDNN's linear is not used for {dtype} here")
    torch.manual_seed(0)
    plain, packed, gated = Linear(96, 80).to(dtype), Linear(96, 80).to(dtype), SiluGateUp(96, 40).to(dtype)
    packed.load_state_dict(plain.state_dict())
    gate, up = (linear._pack(w.contiguous()) for w in gated.weight.detach().chunk(2))
    assert packed.prepack() and gated.prepack()
    for rows in (33, 101, 257, 1000):
        x = torch.randn(rows, 96).to(dtype)
        assert padded_rows(rows) != rows
        exact = _exact(x, packed.weight, packed.bias)
        assert torch.equal(packed(x), exact)
        assert packed.padded(x).shape[0] == padded_rows(rows)
        assert torch.equal(packed.padded(x)[:rows], exact)
        if dtype == torch.float32:  # a plain fp32 weight runs on oneDNN too
            assert torch.equal(plain(x), _exact(x, plain.weight, plain.bias))
        swish = linear._POINTWISE(x, gate, None, "swish", [], "")
        assert torch.equal(gated(x), linear._BINARY(x, swish, up, None, "mul"))


def _recording(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Record the row count of every oneDNN linear call and GELU from now on."""
    rows: list[int] = []

    def record(fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(x: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            rows.append(x.shape[0])
            return fn(x, *args, **kwargs)

        return call

    monkeypatch.setattr(linear, "_POINTWISE", record(linear._POINTWISE))
    monkeypatch.setattr(linear, "_BINARY", record(linear._BINARY))
    monkeypatch.setattr(torch.nn.functional, "gelu", record(torch.nn.functional.gelu))
    return rows


def test_steps_of_every_size_meet_onednn_at_padded_row_counts(
    qwen3_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An encoder and a decoder, many requests of different lengths in steps of every size:
    every oneDNN call (and the encoder's GELU) runs at a count `padded_rows` leaves as it is."""
    bert = build_encoder(tmp_path / "bert", "bert")
    for model in (bert, qwen3_dir):
        with Engine.from_pretrained(model, max_num_batched_tokens=300) as engine:
            rows = _recording(monkeypatch)
            for n in range(PAD_ABOVE + 1, 127, 3):  # a step each: 32 counts oneDNN took as they were
                engine.embed([random_ids(n, seed=n, vocab=1000)])
            engine.embed([random_ids(n, seed=n, vocab=1000) for n in range(1, 121)])  # full steps
            monkeypatch.undo()
        assert len(set(rows)) > 10 and max(rows) > 2 * PAD_ABOVE  # steps of many sizes did run
        assert all(padded_rows(m) == m for m in rows), sorted(set(rows))


def test_no_request_state_is_kept_after_many_requests(qwen3_dir: Path) -> None:
    """Hundreds of concurrent requests, some cancelled, some sharing a cached prefix, one with a
    pinned prompt: afterwards every per-request structure of the loop, core, scheduler and KV
    cache is empty, and the prefix cache holds at most its bound."""
    prefix = random_ids(48, seed=7)

    async def main(engine: Engine) -> None:
        await asyncio.to_thread(engine.cache_prompt, "Instruct: find the passage\nQuery: ")
        for w in range(8):
            calls = [
                engine.embed_async([prefix + random_ids(1 + (w * 37 + i) % 90, seed=w * 100 + i)])
                for i in range(32)
            ]
            tasks = [asyncio.ensure_future(c) for c in calls]
            await asyncio.sleep(0)
            for t in tasks[::5]:
                t.cancel()
            for t in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await t

    with Engine.from_pretrained(qwen3_dir, max_num_batched_tokens=512) as engine:
        asyncio.run(main(engine))
        engine.embed(["settles the loop"])  # the last cancellations are reaped by now
        core = engine._loop.core
        sched, kv = core.scheduler, core.scheduler.kv
        assert engine._loop._futures == {} and core.requests == {}
        assert sched.waiting == [] and sched.running == [] and sched._copies == {}
        assert kv._tables == {} and kv._registered == {}
        pinned = len(kv.pinned)
        assert pinned > 0 and kv.pool.num_used == pinned  # only the pinned prompt holds blocks
        assert kv.pool.num_cached <= kv.pool.max_cached + pinned
        stats = engine.stats()
        assert stats["num_running"] == stats["num_waiting"] == stats["kv_blocks_used"] == 0
        assert stats["prefix_hit_tokens"] > 0  # the shared prefix really was served from the cache
