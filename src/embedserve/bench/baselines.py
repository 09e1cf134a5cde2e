"""The baselines a user would otherwise run, behind the simplest server: a FIFO batcher.

One worker thread takes every request waiting (up to `batch_size`) in arrival order and encodes
them as one padded batch. That is what wrapping `SentenceTransformer.encode` in a web handler
with micro-batching gives: no token budget, no chunking, no priorities. A short query that
arrives behind a batch of 16K-token documents waits for the whole batch.

The worker thread also loads the model, as the engine loop does (engine/loop.py's `start_thread`): a model
loaded on one thread and run on another leaves two OpenMP pools, and GNU OpenMP then stops
spinning between parallel regions, which would slow the baseline by a bench artifact.
"""

from __future__ import annotations

import asyncio
import queue
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass

import numpy as np
import torch

from embedserve.bench.target import BenchInput, Reply, TargetSpec
from embedserve.config import PoolingMethod, parse_dtype
from embedserve.engine.loop import start_thread
from embedserve.errors import InvalidInputError
from embedserve.models.loader import read_model_dir

Encode = Callable[[list[str]], np.ndarray]


@dataclass
class _Item:
    text: str
    future: Future[Reply]
    submitted: float


class FifoBatcher:
    def __init__(self, load: Callable[[], Encode], batch_size: int, device: str) -> None:
        """`load()` runs on the worker thread and returns its encode function; raises what
        `load()` raised."""
        self.device = device
        self._batch_size = batch_size
        self._queue: queue.Queue[_Item | None] = queue.Queue()
        self._thread, _ = start_thread("fifo-batcher", load, self._run)

    async def embed(self, text: BenchInput, priority: str) -> Reply:
        if not isinstance(text, str):
            raise InvalidInputError("the library baselines take text only (no --images-per-input)")
        # FIFO on purpose: the baseline has no notion of priority.
        fut: Future[Reply] = Future()
        self._queue.put(_Item(text, fut, time.perf_counter()))
        return await asyncio.wrap_future(fut)

    def counters(self) -> dict[str, int]:
        return {}

    async def aclose(self) -> None:
        self._queue.put(None)
        await asyncio.to_thread(self._thread.join)

    def _take_batch(self) -> tuple[list[_Item], bool]:
        first = self._queue.get()
        if first is None:
            return [], True
        batch, stop = [first], False
        while len(batch) < self._batch_size:
            try:
                nxt = self._queue.get_nowait()
            except queue.Empty:
                break
            if nxt is None:
                stop = True
                break
            batch.append(nxt)
        # Requests cancelled while waiting (client gone) are dropped, never computed.
        return [b for b in batch if b.future.set_running_or_notify_cancel()], stop

    def _run(self, encode: Encode) -> None:
        stop = False
        while not stop:
            batch, stop = self._take_batch()
            if not batch:
                continue
            start = time.perf_counter()
            try:
                vectors = encode([b.text for b in batch])
            except Exception as e:  # an OOM or a bad input fails this batch, not the server
                for b in batch:
                    b.future.set_exception(e)
                continue
            for b, v in zip(batch, vectors, strict=True):
                b.future.set_result(Reply(np.asarray(v, dtype=np.float32), start - b.submitted))


def open_sentence_transformers(spec: TargetSpec, token_budget: int | None) -> FifoBatcher:
    from sentence_transformers import SentenceTransformer

    device = spec.options.get("device", "cpu")
    dtype = parse_dtype(spec.options.get("dtype", "float32"))
    batch_size = spec.int_option("batch_size", 32) or 32

    def load() -> Encode:
        model = SentenceTransformer(
            spec.location, device=device, local_files_only=True, model_kwargs={"dtype": dtype}
        )

        def encode(texts: list[str]) -> np.ndarray:
            out = model.encode(texts, batch_size=batch_size, convert_to_tensor=True, show_progress_bar=False)
            return out.float().cpu().numpy()

        return encode

    return FifoBatcher(load, batch_size, torch.device(device).type)


def open_hf(spec: TargetSpec, token_budget: int | None) -> FifoBatcher:
    """transformers AutoModel with the tokenizer's own padding side and the model's ST pooling."""
    from transformers import AutoModel, AutoTokenizer

    device = torch.device(spec.options.get("device", "cpu"))
    dtype = parse_dtype(spec.options.get("dtype", "float32"))
    pooling = read_model_dir(spec.location).pooling
    batch_size = spec.int_option("batch_size", 32) or 32

    def load() -> Encode:
        tok = AutoTokenizer.from_pretrained(spec.location, local_files_only=True)
        model = AutoModel.from_pretrained(spec.location, dtype=dtype, local_files_only=True).to(device).eval()

        def encode(texts: list[str]) -> np.ndarray:
            batch = tok(texts, padding=True, return_tensors="pt").to(device)
            with torch.inference_mode():
                hidden = model(**batch).last_hidden_state.float()  # [batch, seq, hidden]
            vec = pool_padded(hidden, batch["attention_mask"], pooling.method)
            if pooling.normalize:
                vec = torch.nn.functional.normalize(vec, dim=-1)
            return vec.cpu().numpy()

        return encode

    return FifoBatcher(load, batch_size, device.type)


def pool_padded(hidden: torch.Tensor, mask: torch.Tensor, method: PoolingMethod) -> torch.Tensor:
    """Pool [batch, seq, hidden] under an attention mask, for left or right padding."""
    rows = torch.arange(hidden.shape[0], device=hidden.device)
    if method is PoolingMethod.LAST:
        # cumsum peaks first at the last attended position, whichever side was padded
        return hidden[rows, mask.cumsum(1).argmax(1)]
    if method is PoolingMethod.CLS:
        return hidden[rows, mask.argmax(1)]
    m = mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * m).sum(1) / m.sum(1).clamp(min=1)
