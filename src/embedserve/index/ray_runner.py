"""`embedserve index --ray`: the pipeline's stage functions on Ray Data.

    driver: documents ─> ray.data ─map_batches(chunk_stage)─> map_batches(EmbedActor pool) ─┐
    driver: Writer (upsert, stale tails, flush)  <────────── iter_batches ──────────────────┘

Chunking runs as plain tasks; embedding runs in an actor pool, each actor holding one engine
(one actor per GPU with `--device cuda`, else `--ray-actors`, default 1). The driver reads the
store once (what is already stored) and writes every row, so the store needs no access from
the workers: a Milvus Lite file works, and a Milvus cluster is reached the same way by passing
its URI (`--store http://host:19530 --token ...`). Each actor checks that its model gives the
schema the driver planned with, so a worker with other weights cannot slip vectors in.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
from tqdm import tqdm

from embedserve.index.chunking import Chunker
from embedserve.index.documents import Document
from embedserve.index.embedder import EmbedderSpec, VectorMeta
from embedserve.index.embedders import build_embedder
from embedserve.index.errors import SchemaMismatchError, StoreError
from embedserve.index.late import chunk_overlap
from embedserve.index.pipeline import (
    Batch,
    IndexStats,
    Writer,
    check_chunk_limit,
    chunk_stage,
    chunk_tokens,
    embed_stage,
    open_collection,
)
from embedserve.index.store import Store
from embedserve.tokenizer import Tokenizer

_DOCS_PER_CHUNK_TASK = 32


@dataclass(frozen=True)
class Described:
    """What the driver needs to know about the embedder before any actor starts."""

    meta: VectorMeta
    dimension: int
    max_tokens: int | None
    tokenizer: Tokenizer | None


def _describe(spec: EmbedderSpec) -> Described:
    embedder = build_embedder(spec)
    try:
        return Described(embedder.meta, embedder.dimension, embedder.max_tokens, embedder.tokenizer)
    finally:
        embedder.close()


class EmbedActor:
    """One embedder per actor, built once; `__call__` is the pipeline's embed stage."""

    def __init__(self, spec: EmbedderSpec, schema: str, stored: Any) -> None:
        import ray

        self.embedder = build_embedder(spec)
        if self.embedder.meta.embedding_schema != schema:
            raise SchemaMismatchError(
                "a Ray worker's embedder disagrees with the driver",
                schema,
                self.embedder.meta.embedding_schema,
            )
        self.stored: dict[str, str] = ray.get(stored) if isinstance(stored, ray.ObjectRef) else stored

    def __call__(self, batch: Batch) -> Batch:
        return embed_stage(batch, self.embedder, self.stored)


def _ray_resources(spec: EmbedderSpec, args: argparse.Namespace) -> tuple[int, float]:
    """(actors, GPUs per actor)."""
    import ray

    on_gpu = spec.endpoint is None and spec.engine.device.startswith("cuda")
    if on_gpu:
        gpus = int(ray.cluster_resources().get("GPU", 0))  # type: ignore[no-untyped-call]
        if gpus < 1:
            raise StoreError("--device cuda with --ray, but the Ray cluster has no GPU")
        return args.ray_actors or gpus, 1.0
    return args.ray_actors or 1, 0.0


@contextlib.contextmanager
def ray_session(address: str | None) -> Iterator[None]:
    """Connect to (or start) Ray. Enter it before opening a Milvus Lite store: Ray cannot start
    its local services from a process already running Milvus Lite's gRPC threads."""
    import ray

    ray.init(address=address, include_dashboard=False, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()


def index_with_ray(
    docs: list[Document], spec: EmbedderSpec, store: Store, args: argparse.Namespace, progress: bool | None
) -> IndexStats:
    """Run inside `ray_session`."""
    if spec.late_chunking or spec.sparse or spec.sparse_model:  # its stages store dense rows of chunks alone
        raise StoreError("--late-chunking, --sparse and --hybrid run in this process for now, not on Ray")
    import ray

    actors, gpus = _ray_resources(spec, args)
    # Learn the schema (and tokenizer) on a worker with the actors' resources: the driver
    # may have no GPU and need not hold the model.
    info: Described = ray.get(ray.remote(num_gpus=gpus)(_describe).remote(spec))
    if info.tokenizer is None:
        raise StoreError("chunking needs the model's tokenizer: pass --tokenizer with --endpoint")
    chunker = Chunker(
        info.tokenizer, chunk_tokens(args.max_tokens, info.max_tokens), chunk_overlap(args.overlap, False)
    )
    check_chunk_limit(chunker, info.max_tokens)
    collection = open_collection(store, info.meta, info.dimension, args.role)
    stored = store.stored_chunks(collection)
    hashes = {cid: s.text_hash for cid, s in stored.items()}
    schema = info.meta.embedding_schema
    ds: ray.data.Dataset = ray.data.from_items([{"doc_id": d.doc_id, "text": d.text} for d in docs])
    ds = ds.map_batches(
        functools.partial(chunk_stage, chunker=chunker, schema=schema),
        batch_size=_DOCS_PER_CHUNK_TASK,
        batch_format="numpy",
        num_cpus=0.5,
    )
    ds = ds.map_batches(
        EmbedActor,
        fn_constructor_kwargs={"spec": spec, "schema": schema, "stored": ray.put(hashes)},
        batch_size=args.batch_size,
        batch_format="numpy",
        compute=ray.data.ActorPoolStrategy(size=actors),
        num_gpus=gpus,
        num_cpus=0.5 if gpus == 0 else 1,
    )
    bar = tqdm(unit="chunk", desc="indexing (ray)", disable=None if progress is None else not progress)
    writer = Writer(store, collection, info.meta, stored, bar)
    for batch in ds.iter_batches(batch_size=None, batch_format="numpy"):
        writer.write({k: np.asarray(v) for k, v in batch.items()})
    stats = writer.finish()
    store.point(args.role, collection)
    return stats
