"""What `embedserve index / search / migrate` do with their parsed options."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from embedserve.engine.options import EngineOptions
from embedserve.index.chunking import Chunker
from embedserve.index.documents import read_documents
from embedserve.index.embedder import Embedder, EmbedderSpec
from embedserve.index.embedders import build_embedder, source_fields
from embedserve.index.errors import DocumentError, StoreError
from embedserve.index.late import chunk_overlap
from embedserve.index.pipeline import IndexStats, chunk_tokens, index_documents
from embedserve.index.store import Hit, Store
from embedserve.models.default import default_model_path


def embedder_spec(args: argparse.Namespace, prefix: str = "") -> EmbedderSpec:
    """The embedder named by --embedder or --model/--endpoint (or their --live-... forms)."""

    def opt(name: str) -> Any:
        return getattr(args, (prefix + name).replace("-", "_"), None)

    from embedserve.models.default import DEFAULT_MODEL_NAME, PACKAGE, default_model_path

    engine = EngineOptions.from_args(args)
    named: dict[str, Any] = {
        "model": opt("model"),
        "endpoint": opt("endpoint"),
        "api_key": opt("api-key"),
        "endpoint_model": opt("endpoint-model"),
        "tokenizer": opt("tokenizer"),
        "engine": engine,
    }
    if opt("embedder") is not None:
        flags = ("model", "endpoint", "api-key", "endpoint-model", "tokenizer")
        given = [f"--{prefix}{k}" for k in flags if opt(k)]
        if given:
            raise StoreError(f"pass --{prefix}embedder or {', '.join(given)}, not both")
        named.update(source_fields(opt("embedder"), engine))
    model, endpoint = named["model"], named["endpoint"]
    if model is not None and endpoint is not None:
        raise StoreError(f"pass --{prefix}model or --{prefix}endpoint, not both")
    if model is None and endpoint is None:
        if prefix:
            ways = f"--{prefix}embedder, --{prefix}model or --{prefix}endpoint"
            raise StoreError(f"the {prefix.rstrip('-')} side needs {ways}")
        model = named["model"] = str(default_model_path())
    # The bundled default model's folder is just "model": name it as the server does.
    name = DEFAULT_MODEL_NAME if model is not None and Path(model).parent.name == PACKAGE else None
    return EmbedderSpec(
        **named,
        name=name,
        model_version=opt("model-version"),
        dimensions=opt("dimensions"),
        query_prompt_name=getattr(args, "query_prompt_name", None),
        embedding_type=opt("embedding-type") or "float",
        int8_calibration=opt("int8-calibration"),
        int8_scale=opt("int8-scale") or 1.0,
        late_chunking=bool(opt("late-chunking")),
        sparse=bool(opt("sparse")),
        sparse_model=opt("sparse-model"),
        multivector=bool(opt("multivector")),
    )


def make_chunker(embedder: Embedder, args: argparse.Namespace) -> Chunker:
    if embedder.tokenizer is None:
        raise StoreError("chunking needs the model's tokenizer: pass --tokenizer with --endpoint")
    overlap = chunk_overlap(args.overlap, embedder.late)
    return Chunker(embedder.tokenizer, chunk_tokens(args.max_tokens, embedder.max_tokens), overlap)


@contextlib.contextmanager
def opened_store(args: argparse.Namespace) -> Iterator[Store]:
    from pymilvus.exceptions import MilvusException

    store = Store(args.store, args.token)
    try:
        yield store
    except MilvusException as e:  # an operation the store refused: say so without a traceback
        raise StoreError(f"the vector store {args.store} refused an operation: {e.message}") from None
    finally:
        store.close()


def one_source_hybrid(spec: EmbedderSpec) -> EmbedderSpec:
    """A hybrid index without --sparse-model: both sides from the one model (BGE-M3) or endpoint."""
    return dataclasses.replace(spec, sparse_model=spec.endpoint or spec.model or str(default_model_path()))


@contextlib.contextmanager
def built(spec: EmbedderSpec) -> Iterator[Embedder]:
    embedder = build_embedder(spec)
    try:
        yield embedder
    finally:
        embedder.close()


def cmd_index(args: argparse.Namespace) -> int:
    spec = embedder_spec(args)
    hybrid = bool(getattr(args, "hybrid", False))
    if hybrid and spec.sparse_model is None:  # one model giving both (BGE-M3): index/embedders.py
        spec = one_source_hybrid(spec)
    if spec.sparse_model is not None and not hybrid:
        raise StoreError("--sparse-model builds a hybrid index: add --hybrid")
    docs = list(read_documents(args.paths))
    if not docs:
        raise DocumentError(f"no documents with text under {', '.join(args.paths)}")
    progress = None if args.progress == "auto" else args.progress == "on"
    if args.ray:
        from embedserve.index.ray_runner import index_with_ray, ray_session

        with ray_session(args.ray_address), opened_store(args) as store:
            stats = index_with_ray(docs, spec, store, args, progress)
    else:
        with built(spec) as embedder, opened_store(args) as store:  # a refused model leaves no store file
            chunker = make_chunker(embedder, args)
            stats = index_documents(docs, embedder, store, chunker, args.role, args.batch_size, progress)
    _print_stats(stats, args.role)
    return 0


def _print_stats(s: IndexStats, role: str) -> None:
    print(
        f"{s.documents} documents -> {s.chunks} chunks: {s.embedded} embedded, {s.skipped} already stored, "
        f"{s.deleted_stale} stale removed; collection {s.collection} holds {s.rows} rows; "
        f"'{role}' -> {s.collection}"
    )


def cmd_search(args: argparse.Namespace) -> int:
    from embedserve.index.search import search
    from embedserve.index.sparse import Fusion

    fusion = None if args.hybrid is None else Fusion.parse(args.hybrid)  # before any model loads
    k = max(args.k, args.rerank_depth) if args.rerank else args.k
    spec = embedder_spec(args)
    if fusion is not None and spec.sparse_model is None:  # one model giving both (BGE-M3)
        spec = one_source_hybrid(spec)
    with opened_store(args) as store, built(spec) as embedder:
        hits = search(
            store, embedder, [args.query], k, args.filter, args.index, args.rescore, fusion, args.depth
        )[0]
    if args.rerank:
        hits = reranked(args.rerank, args.query, hits, args.k)
    if args.json:
        json.dump(
            [{"doc_id": h.doc_id, "chunk_idx": h.chunk_idx, "score": h.score, "text": h.text} for h in hits],
            sys.stdout,
        )
        print()
        return 0
    for rank, h in enumerate(hits, 1):
        preview = " ".join(h.text.split())[:100]
        print(f"{rank:3d}. {h.score:.4f}  {h.doc_id}#{h.chunk_idx}  {preview}")
    return 0


def reranked(spec: str, query: str, hits: list[Hit], k: int) -> list[Hit]:
    """`hits` scored by the reranker `spec` names (embedders/scorers.py), best first, top k."""
    from embedserve.embedders.scorers import open_scorer

    if not hits:
        return hits
    score, close = open_scorer(spec)
    try:
        scores = score(query, [h.text for h in hits])
    finally:
        close()
    order = sorted(range(len(hits)), key=lambda i: (-scores[i], i))[:k]
    return [dataclasses.replace(hits[i], score=float(scores[i])) for i in order]


def cmd_shadow(args: argparse.Namespace) -> int:
    from embedserve.index.migrate import shadow_report
    from embedserve.index.shadow_io import load_qrels, load_queries, render_markdown, write_report

    queries = load_queries(args.queries)
    qrels = load_qrels(args.qrels) if args.qrels else None
    with (
        opened_store(args) as store,
        built(embedder_spec(args, "live-")) as old,
        built(embedder_spec(args)) as new,
    ):
        report = shadow_report(store, old, new, queries, qrels, args.depth)
    if args.out:
        for path in write_report(report, args.out):
            print(f"wrote {path}", file=sys.stderr)
    if args.json:
        json.dump(report, sys.stdout, indent=2)
        print()
    else:
        print(render_markdown(report), end="")
    return 0


def cmd_aliases(args: argparse.Namespace) -> int:
    from embedserve.index import migrate

    with opened_store(args) as store:
        if args.action == "cutover":
            result: object = migrate.cutover(store)
        elif args.action == "rollback":
            result = migrate.rollback(store)
        else:
            result = migrate.status(store)
    json.dump(result, sys.stdout, indent=2)
    print()
    return 0
