"""Late chunking vs independent chunks on one engine: cost and retrieval, in one run.

Every Python-docs topic (`--dataset pydocs`'s help() topics: query = its first paragraph,
document = the rest) is cut by the indexer's chunker (`--chunk-tokens`, no overlap). The
independent arm embeds each chunk alone; the late arm embeds runs of consecutive chunks that
fit `--window` tokens as one late-chunked request (`chunk_spans`), so each chunk vector sees its
window. Both arms index the same chunks; a document scores as its best chunk. The arms
alternate over `--rounds` (medians): documents/s and tokens computed per second.

    python benchmarks/late_chunking.py                      # the default model (MiniLM, 512)
    python benchmarks/late_chunking.py --model DIR --window 8192 --chunk-tokens 256
    python benchmarks/late_chunking.py --multivector        # + a ColBERT arm (MaxSim)

`--multivector` adds a third arm: a multi-vector model (`--colbert DIR`, default: MiniLM's
encoder with a seeded random Dense(384 -> 128), tests/helpers/tiny_multivector.py; not a
trained ColBERT) embeds the same chunks on the document side, a query on the query side
(expanded to 32 tokens); a document scores MaxSim over all its chunks' token vectors.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from embedserve import Engine
from embedserve.engine.ask import Ask
from embedserve.engine.multivector import maxsim
from embedserve.index.chunking import Chunk, Chunker
from embedserve.index.engine_embedder import EngineEmbedder
from embedserve.index.late import Window, late_windows
from embedserve.models.default import default_model_path
from embedserve.parity.datasets.pydocs import topic_pairs
from embedserve.pooling.outputs import Output


def embed_independent(engine: Engine, docs: list[list[Chunk]]) -> tuple[list[np.ndarray], int]:
    out, tokens = [], 0
    for chunks in docs:
        res = engine.run([c.text for c in chunks])
        out.append(np.stack([r.embedding for r in res]))
        tokens += sum(r.num_tokens for r in res)
    return out, tokens


def embed_late(engine: Engine, windows: list[list[Window]]) -> tuple[list[np.ndarray], int]:
    """The indexer's late path (`EngineEmbedder.embed_late_documents`: a document's windows
    submitted together); tokens computed from the engine's own count."""
    embedder = EngineEmbedder(engine, "bench", late=True)
    before = engine.stats()["tokens_computed"]
    out = []
    for doc_windows in windows:
        rows = embedder.embed_late_documents([(w.text, list(w.spans)) for w in doc_windows])
        out.append(np.concatenate(rows))
    return out, engine.stats()["tokens_computed"] - before


def embed_multivector(engine: Engine, docs: list[list[Chunk]]) -> tuple[list[np.ndarray], int]:
    """Each document as all its chunks' token vectors (document side), chunks embedded alone."""
    out, tokens = [], 0
    for chunks in docs:
        prepared = engine.prepare([c.text for c in chunks], Ask(Output.MULTIVECTOR, truncate="end"))
        futures = engine.submit(prepared)
        out.append(np.concatenate([f.result().vector.numpy() for f in futures]))
        tokens += sum(len(t.token_ids) for t in prepared.tokenized)
    return out, tokens


def maxsim_scores(queries: list[np.ndarray], docs: list[np.ndarray]) -> np.ndarray:
    """[queries, docs] MaxSim: each query vector's best document vector, summed."""
    return np.array([[maxsim(q, d) for d in docs] for q in queries])


def retrieval(
    queries: np.ndarray | list[np.ndarray], docs: list[np.ndarray], k: int = 10
) -> dict[str, float]:
    """Known-item retrieval (query i's document is document i), a document as its best chunk
    (multi-vector queries: MaxSim over the document's token vectors)."""
    if isinstance(queries, list):
        scores = maxsim_scores(queries, docs)
    else:
        scores = np.stack([(queries @ d.T).max(axis=1) for d in docs], axis=1)  # [queries, docs]
    ranks = (scores > scores.diagonal()[:, None]).sum(axis=1)  # 0 = first
    return {
        f"nDCG@{k}": float(np.mean(np.where(ranks < k, 1 / np.log2(ranks + 2), 0.0))),
        f"Recall@{k}": float(np.mean(ranks < k)),
        "Recall@1": float(np.mean(ranks < 1)),
        "MRR": float(np.mean(1 / (ranks + 1))),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=None, help="model directory (default: the default model)")
    ap.add_argument("--chunk-tokens", type=int, default=128)
    ap.add_argument("--window", type=int, default=None, help="tokens per late request (max_model_len)")
    ap.add_argument("--max-model-len", type=int, default=None, help="engine max_model_len (MiniLM: 512)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--budget", type=int, default=2048, help="engine token budget")
    ap.add_argument("--multivector", action="store_true", help="add the multi-vector (MaxSim) arm")
    ap.add_argument("--colbert", type=Path, default=Path("/tmp/embedserve-bench-colbert"),
                    help="the multi-vector model's directory (built there if absent)")  # fmt: skip
    args = ap.parse_args()
    model = args.model or default_model_path()
    pairs = topic_pairs()
    query_texts = [q for q, _ in pairs.values()]
    texts = [d for _, d in pairs.values()]
    options = {"max_model_len": args.max_model_len} if args.max_model_len else {}
    with Engine.from_pretrained(model, max_num_batched_tokens=args.budget, **options) as engine:
        window = (args.window or engine.config.scheduler.max_model_len) - engine.tokenizer.num_special
        chunker = Chunker(engine.tokenizer, args.chunk_tokens, 0)
        docs = [chunker.split(t) for t in texts]
        runs = [  # the indexer's windows (index/late.py)
            list(dict.fromkeys(w for w, _ in late_windows(t, cs, chunker.count, window)))
            for t, cs in zip(texts, docs, strict=True)
        ]
        queries = engine.embed(query_texts, truncate="end")
        times: dict[str, list[float]] = {"independent": [], "late": []}
        vectors: dict[str, list[np.ndarray]] = {}
        tokens: dict[str, int] = {}
        for _ in range(args.rounds):
            for arm in ("independent", "late"):
                start = time.perf_counter()
                if arm == "late":
                    vectors[arm], tokens[arm] = embed_late(engine, runs)
                else:
                    vectors[arm], tokens[arm] = embed_independent(engine, docs)
                times[arm].append(time.perf_counter() - start)
    arms = ["independent", "late"]
    if args.multivector:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the test fixtures' builder
        from tests.helpers.tiny_multivector import build_colbert

        arms.append("multivector")
        times["multivector"] = []
        with Engine.from_pretrained(
            build_colbert(args.colbert), max_num_batched_tokens=args.budget
        ) as colbert:
            mv_queries = colbert.embed_multivector(query_texts, input_type="query", truncate="end")
            for _ in range(args.rounds):
                start = time.perf_counter()
                vectors["multivector"], tokens["multivector"] = embed_multivector(colbert, docs)
                times["multivector"].append(time.perf_counter() - start)
    n_chunks = sum(len(c) for c in docs)
    print(f"model {model}; {len(texts)} documents, {n_chunks} chunks of <= {args.chunk_tokens} tokens; "
          f"late windows of <= {window} content tokens ({sum(len(r) for r in runs)} requests); "
          f"{args.rounds} rounds, medians")  # fmt: skip
    print("| arm | documents/s | tokens computed | tokens/s | nDCG@10 | Recall@10 | Recall@1 | MRR |")
    print("|---|---|---|---|---|---|---|---|")
    for arm in arms:
        t = statistics.median(times[arm])
        m = retrieval(mv_queries if arm == "multivector" else queries, vectors[arm])
        quality = " | ".join(f"{m[k]:.4f}" for k in ("nDCG@10", "Recall@10", "Recall@1", "MRR"))
        print(f"| {arm} | {len(texts) / t:.2f} | {tokens[arm]:,} | {tokens[arm] / t:,.0f} | {quality} |")
    ratio = statistics.median(times["independent"]) / statistics.median(times["late"])
    print(f"late / independent documents/s: {ratio:.2f}x")


if __name__ == "__main__":
    main()
