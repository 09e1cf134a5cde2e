"""`embedserve index`, `embedserve search`, `embedserve migrate`: options and dispatch."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from embedserve.engine.options import add_engine_options, positive_int
from embedserve.index.store import LIVE, PREVIOUS, SHADOW
from embedserve.models.default import DEFAULT_MODEL_NAME, model_argument

DEFAULT_STORE = "./embedserve.db"


def _add_store(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("store")
    g.add_argument(
        "--store",
        default=DEFAULT_STORE,
        help="Milvus Lite file (a local path) or Milvus server URI http://host:19530 (default: %(default)s)",
    )
    g.add_argument("--token", default=None, help="Milvus token (user:password or API key) for a server")


def _add_embedder(p: argparse.ArgumentParser, prefix: str = "", who: str = "") -> None:
    """--embedder, or --model / --endpoint (with `prefix`: --live-... for the old side)."""
    g = p.add_argument_group(f"{who or 'embedder'}")
    g.add_argument(
        f"--{prefix}embedder",
        default=None,
        metavar="SPEC",
        help="engine:DIR?opts or http://HOST:PORT?model=M&api_key_env=VAR&tokenizer=DIR, the spec grammar "
        "of parity and bench (docs/specs.md), instead of --model / --endpoint; an engine spec's options "
        "apply on top of the engine flags",
    )
    if prefix:
        g.add_argument(
            f"--{prefix}model",
            default=None,
            type=model_argument,
            help=f"local model directory of the {who} (or {DEFAULT_MODEL_NAME}, the bundled default)",
        )
    g.add_argument(
        f"--{prefix}endpoint",
        default=None,
        help="embedserve server or gateway URL (http://host:port) instead of an in-process model",
    )
    g.add_argument(f"--{prefix}api-key", default=None, help="bearer token for the endpoint")
    g.add_argument(f"--{prefix}endpoint-model", default=None, help="model name to request from the endpoint")
    g.add_argument(
        f"--{prefix}tokenizer",
        default=None,
        help="model directory or tokenizer.json to chunk with, when embedding through an endpoint",
    )
    g.add_argument(
        f"--{prefix}model-version", default=None, help="version label (as `serve --model-version`)"
    )
    g.add_argument(f"--{prefix}dimensions", type=positive_int, default=None, help="Matryoshka dimensions")
    g.add_argument(
        f"--{prefix}embedding-type",
        choices=["float", "int8", "uint8", "binary", "ubinary"],
        default="float",
        help="store / search compressed vectors (their own schema; int8 ranges: --int8-calibration "
        "or --int8-scale)",
    )
    g.add_argument(
        f"--{prefix}int8-calibration", default=None, metavar="NPY", help="int8 ranges (as `serve`)"
    )
    g.add_argument(f"--{prefix}int8-scale", type=float, default=1.0, help="int8 fixed range (as `serve`)")
    g.add_argument(
        f"--{prefix}sparse",
        action="store_true",
        help="the model (or the --endpoint's) is a SPLADE model, or BGE-M3's lexical weights: a sparse "
        "index, inner product",
    )
    g.add_argument(
        f"--{prefix}sparse-model",
        default=None,
        metavar="DIR|URL",
        help="a SPLADE model (a directory, or a server's URL) beside the dense --model / --endpoint: a "
        "hybrid index (index --hybrid), search fuses both; without it --hybrid takes both from one "
        "model or endpoint (BGE-M3)",
    )
    g.add_argument(
        f"--{prefix}multivector",
        action="store_true",
        help="the model is a multi-vector (ColBERT) model: its token vectors as rows, searched by MaxSim",
    )
    g.add_argument(
        f"--{prefix}late-chunking",
        action="store_true",
        help="late chunking: each chunk pooled inside its document (windows of the model's input; "
        "chunks do not overlap); an index of its own schema, searched with this flag too",
    )


def _add_engine(p: argparse.ArgumentParser) -> None:
    add_engine_options(p)
    # None means "not given": --endpoint needs no model, and the default model is resolved
    # (and hashed) only when it is really used.
    p.set_defaults(model=None)


def _add_chunking(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("chunking and writing")
    g.add_argument(
        "paths", nargs="+", help=".txt/.md/.rst files, .jsonl files (id, text per line), or folders"
    )
    g.add_argument(
        "--max-tokens",
        type=positive_int,
        default=None,
        help="tokens per chunk, special tokens included (default: 512, or the model's limit if lower)",
    )
    g.add_argument(
        "--overlap",
        type=int,
        default=None,
        help="tokens consecutive chunks share (64; 0 with --late-chunking)",
    )
    g.add_argument(
        "--batch-size", type=positive_int, default=128, help="chunks embedded and written per batch"
    )
    g.add_argument(
        "--progress",
        choices=["auto", "on", "off"],
        default="auto",
        help="progress bar on stderr (auto: only on a terminal)",
    )
    g.add_argument("--ray", action="store_true", help="run the stages on Ray Data (see docs/indexing.md)")
    g.add_argument("--ray-address", default=None, help="Ray cluster address (default: start a local Ray)")
    g.add_argument(
        "--ray-actors",
        type=positive_int,
        default=None,
        help="embedding actors (default: one per GPU with --device cuda, else 1)",
    )


def _command(name: str) -> Callable[[argparse.Namespace], int]:
    """index/commands.py's `name`, imported when it runs: building `embedserve`'s parser stays
    light (a gateway's process loads no torch)."""

    def run(args: argparse.Namespace) -> int:
        from embedserve.index import commands

        return int(getattr(commands, name)(args))

    return run


def register(sub: Any) -> None:
    p = sub.add_parser("index", help="chunk, embed and store documents in a vector database")
    p.add_argument(
        "--hybrid",
        action="store_true",
        help="dense + sparse vectors per chunk (one BGE-M3 model or endpoint, or --sparse-model)",
    )
    _add_chunking(p)
    _add_store(p)
    _add_embedder(p)
    _add_engine(p)
    p.set_defaults(func=_command("cmd_index"), role=LIVE)

    p = sub.add_parser("search", help="search the live index (schema-checked)")
    p.add_argument("query")
    p.add_argument("-k", type=positive_int, default=10, help="chunks to return")
    p.add_argument(
        "--rescore",
        type=int,
        default=0,
        metavar="N",
        help="compressed index: take the top N by the compressed search, reorder by the float query",
    )
    p.add_argument(
        "--hybrid",
        default=None,
        metavar="FUSION",
        help="a hybrid index's fusion: rrf (default) or weighted:W_DENSE,W_SPARSE",
    )
    p.add_argument(
        "--depth",
        type=positive_int,
        default=100,
        help="hybrid: candidates per ranking fused; multivector: token rows per query vector",
    )
    p.add_argument(
        "--rerank",
        default=None,
        metavar="SPEC",
        help="rerank the top --rerank-depth chunks with a reranker (docs/specs.md: http://HOST:PORT, "
        "engine:DIR, sentence-transformers:DIR, hf:DIR); scores become the reranker's",
    )
    p.add_argument("--rerank-depth", type=positive_int, default=50, help="chunks the reranker scores")
    p.add_argument("--filter", default="", help="Milvus filter expression, e.g. 'doc_id like \"pep-08%%\"'")
    p.add_argument("--json", action="store_true", help="print [{doc_id, chunk_idx, score, text}]")
    p.add_argument("--index", default=LIVE, choices=[LIVE, SHADOW, PREVIOUS], help="which index to search")
    p.add_argument("--query-prompt-name", default=None, help="prompt name for the query (default: 'query')")
    _add_store(p)
    _add_embedder(p)
    _add_engine(p)
    p.set_defaults(func=_command("cmd_search"))

    m = sub.add_parser("migrate", help="model upgrades: build a shadow index, compare, cut over, roll back")
    msub = m.add_subparsers(dest="migrate_command", required=True)
    p = msub.add_parser("build", help="index documents with a new model into the shadow index")
    p.add_argument(
        "--hybrid",
        action="store_true",
        help="dense + sparse vectors per chunk (one BGE-M3 model or endpoint, or --sparse-model)",
    )
    _add_chunking(p)
    _add_store(p)
    _add_embedder(p, who="new model")
    _add_engine(p)
    p.set_defaults(func=_command("cmd_index"), role=SHADOW)

    p = msub.add_parser("shadow", help="run a query set against live (old model) and shadow (new model)")
    p.add_argument("--queries", required=True, help=".jsonl with id and text per line")
    p.add_argument("--qrels", default=None, help="relevance judgments: 'qid docid gain' lines (or TREC)")
    p.add_argument("--depth", type=positive_int, default=100, help="documents ranked per query")
    p.add_argument("--out", default=None, help="folder for shadow_report.json and shadow_report.md")
    p.add_argument("--json", action="store_true", help="print the report as JSON instead of markdown")
    _add_store(p)
    _add_embedder(p, who="new model")
    _add_embedder(p, prefix="live-", who="live model")
    _add_engine(p)
    p.set_defaults(func=_command("cmd_shadow"))

    for name, text in (
        ("cutover", "point live at the shadow index (atomic alias move); the old one stays as previous"),
        ("rollback", "point live back at the previous index"),
        ("status", "show which collection each alias points at"),
    ):
        p = msub.add_parser(name, help=text)
        _add_store(p)
        p.set_defaults(func=_command("cmd_aliases"), action=name)
