"""Warm-up and health probes: real forward passes whose vectors are checked, not just run.

Warm-up covers the configured input lengths and one step that fills the whole per-step
token budget, so the largest activation shapes have been allocated (and any out-of-memory
surfaces) before the server reports ready.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import numpy as np
from PIL import Image

from embedserve.engine.ask import Ask, answers_as
from embedserve.engine.engine import EmbeddingOutput, Engine
from embedserve.errors import InternalEngineError, ModelLoadError
from embedserve.pooling.outputs import Output, multivectors_only
from embedserve.tokenizer import Truncate

log = logging.getLogger(__name__)


def full_step_lengths(budget: int, max_model_len: int) -> list[int]:
    """Input lengths that together fill exactly one step of `budget` tokens."""
    seq = min(budget, max_model_len)
    lengths = [seq] * (budget // seq)
    if budget % seq:
        lengths.append(budget % seq)
    return lengths


DEFAULT_WARMUP_LENGTHS = (16, 512)


def warmup_shapes(lengths: tuple[int, ...] | None, budget: int, max_model_len: int) -> list[list[int]]:
    """One batch per length, then the full step. Default lengths are capped at the model's
    limit; lengths the operator chose must fit it."""
    if lengths is None:
        lengths = tuple(sorted({min(n, max_model_len) for n in DEFAULT_WARMUP_LENGTHS}))
    for n in lengths:
        if not 1 <= n <= max_model_len:
            raise ModelLoadError(f"warm-up length {n} is outside [1, max_model_len={max_model_len}]")
    return [[n] for n in lengths] + [full_step_lengths(budget, max_model_len)]


def _ids(engine: Engine, n: int) -> list[int]:
    # Real text cut to n tokens by the tokenizer's own policy, so the end token is in place.
    return engine.tokenizer.encode("warm " * n, n, Truncate.END).token_ids


def check_vectors(engine: Engine, outputs: list[EmbeddingOutput]) -> None:
    width = engine.config.vector_size
    normalize = engine.config.pooling.normalize
    if multivectors_only(engine.outputs):  # a ColBERT model's token vectors, each checked
        head = engine.multivector_head
        assert head is not None
        width, normalize = head.dim, head.normalize
    for out in outputs:
        for v in out.embedding if out.embedding.ndim == 2 else [out.embedding]:
            if v.shape != (width,) or not np.isfinite(v).all():
                raise InternalEngineError(
                    f"forward pass produced a bad vector (shape {v.shape}, non-finite values)"
                )
            if normalize and abs(float(np.linalg.norm(v)) - 1.0) > 1e-3:
                raise InternalEngineError(f"normalized vector has norm {float(np.linalg.norm(v)):.4f}")


async def embed_ids(engine: Engine, items: list[Any]) -> list[EmbeddingOutput]:
    """Warm-up inputs without a prompt; a ColBERT model's as documents (its token vectors, cut
    to its document length)."""
    ask = Ask(prompt="")
    if multivectors_only(engine.outputs):
        ask = Ask(Output.MULTIVECTOR, prompt="", truncate="end")
    return answers_as(await engine.run_async(items, ask), EmbeddingOutput)


async def warm_up(engine: Engine, lengths: tuple[int, ...] | None) -> float:
    """Run every warm-up shape through the engine; returns the seconds it took."""
    sched = engine.config.scheduler
    start = time.perf_counter()
    for shape in warmup_shapes(lengths, sched.max_num_batched_tokens, sched.max_model_len):
        t = time.perf_counter()
        outputs = await embed_ids(engine, [_ids(engine, n) for n in shape])
        check_vectors(engine, outputs)
        log.info("warm-up: %d input(s), %d tokens in %.3f s", len(shape), sum(shape), time.perf_counter() - t)
    if engine.config.cache.prefix_caching:  # the model's prompts, whole, cached for good
        prompts = sorted({text for text in engine.config.prompts.values() if text})
        tokens = [await asyncio.to_thread(engine.cache_prompt, text) for text in prompts]
        if prompts:
            log.info("warm-up: %d prompt(s) of %s tokens kept in the prefix cache", len(prompts), tokens)
    if engine.multimodal:  # the vision tower too, on one small image
        image = Image.new("RGB", (64, 64), (128, 128, 128))
        check_vectors(engine, await embed_ids(engine, [["warm", image]]))
    return time.perf_counter() - start


async def probe(engine: Engine) -> None:
    """One short real forward pass; raises if it fails or its vector is bad."""
    n = min(8, engine.config.scheduler.max_model_len)
    check_vectors(engine, await embed_ids(engine, [_ids(engine, n)]))
