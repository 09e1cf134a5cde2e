"""Dense, sparse and hybrid retrieval through the indexer and Milvus Lite, on one dataset.

Each document is chunked, indexed three ways (a dense model, a SPLADE model, both: the same
code as `embedserve index --sparse / --hybrid`), every query searched (a document ranked by
its best chunk) and scored against the dataset's judgments: nDCG@10, Recall@10, Recall@100.

    python benchmarks/hybrid_retrieval.py --dense DIR --sparse SPLADE_DIR --dataset pydocs
    python benchmarks/hybrid_retrieval.py ... --dataset cranfield --data-dir ../shared/data
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from embedserve import Engine
from embedserve.index.chunking import Chunker
from embedserve.index.documents import Document
from embedserve.index.engine_embedder import EngineEmbedder
from embedserve.index.pipeline import index_documents
from embedserve.index.search import rank_documents, search
from embedserve.index.sparse import Fusion, HybridEmbedder, SparseEmbedder
from embedserve.index.store import Store
from embedserve.models.default import default_model_path
from embedserve.parity.datasets import DatasetContext, find_data_dir, load_dataset
from embedserve.parity.metrics import ndcg_at, recall_at


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dense", type=Path, default=None, help="dense model (default: the default model)")
    ap.add_argument("--sparse", type=Path, required=True, help="SPLADE model (SparseEncoder directory)")
    ap.add_argument("--dataset", default="pydocs")
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--max-tokens", type=int, default=256, help="tokens per chunk")
    ap.add_argument("--depth", type=int, default=100, help="hybrid: candidates per ranking")
    args = ap.parse_args()
    dense_dir = args.dense or default_model_path()
    with Engine.from_pretrained(dense_dir) as dense, Engine.from_pretrained(args.sparse) as sparse:
        tok, limit = dense.tokenizer, dense.config.scheduler.max_model_len
        ctx = DatasetContext(
            find_data_dir(args.data_dir), lambda t: len(tok.backend.encode(t).ids), [], limit
        )
        data = load_dataset(args.dataset, ctx)
        docs = [Document(d, str(text)) for d, text in data.corpus.items() if str(text).strip()]
        queries = [str(data.queries[q]) for q in data.qrels]
        chunker = Chunker(tok, min(args.max_tokens, dense.config.scheduler.max_model_len), 0)
        splade = SparseEmbedder(EngineEmbedder(sparse, args.sparse.name))
        both = HybridEmbedder(EngineEmbedder(dense, dense_dir.name), splade)
        arms = {
            "dense": (EngineEmbedder(dense, dense_dir.name), None),
            "sparse": (splade, None),
            "hybrid rrf": (both, Fusion.parse("rrf")),
        }
        print(f"dataset {args.dataset}: {len(docs)} documents, {len(queries)} judged queries; dense "
              f"{dense_dir}, sparse {args.sparse}; chunks of <= {chunker.max_tokens} tokens")  # fmt: skip
        print("| index | nDCG@10 | Recall@10 | Recall@100 | index s | search ms/query |")
        print("|---|---|---|---|---|---|")
        with tempfile.TemporaryDirectory() as tmp:
            for name, (embedder, fusion) in arms.items():
                store = Store(str(Path(tmp) / f"{name.split()[0]}.db"))
                try:
                    start = time.perf_counter()
                    index_documents(docs, embedder, store, chunker, progress=False)
                    indexed = time.perf_counter() - start
                    start = time.perf_counter()
                    hits = search(store, embedder, queries, k=1000, fusion=fusion, depth=args.depth)
                    per_query = (time.perf_counter() - start) / len(queries) * 1000
                finally:
                    store.close()
                ranked = [rank_documents(h, 100) for h in hits]
                judged = [data.qrels[q] for q in data.qrels]
                ndcg = statistics.mean(ndcg_at(r, j, 10) for r, j in zip(ranked, judged, strict=True))
                r10 = statistics.mean(recall_at(r, j, 10) for r, j in zip(ranked, judged, strict=True))
                r100 = statistics.mean(recall_at(r, j, 100) for r, j in zip(ranked, judged, strict=True))
                print(f"| {name} | {ndcg:.4f} | {r10:.4f} | {r100:.4f} | {indexed:.1f} | {per_query:.1f} |")


if __name__ == "__main__":
    main()
