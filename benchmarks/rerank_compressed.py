"""#28 closing numbers, one run on this machine:

1. int8 / binary retrieval on Cranfield with all-MiniLM-L6-v2 (engine vectors): nDCG@10 and
   Recall@100 of float, int8 (fixed scale and corpus-calibrated), binary (Hamming), each
   compressed search also with float rescoring of its top 100.
2. Rerank throughput (pairs/s): Engine.rerank vs sentence-transformers CrossEncoder.predict on
   a cross-encoder of ms-marco-MiniLM-L-6-v2's shape (all-MiniLM-L6-v2's encoder + a random
   one-label head: weights do not change speed), 20 Cranfield queries x 50 documents.

  PYTHONPATH=src python benchmarks/rerank_compressed.py --data-dir ../shared/data/cranfield
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from embedserve import Engine
from embedserve.api.quantize import Calibration
from embedserve.index.quantized import decoded, stored_codes
from embedserve.models.default import default_model_path
from embedserve.parity.metrics import mean_over, retrieval_scores
from tests.helpers.cranfield import Cranfield
from tests.helpers.cranfield import load as load_cranfield


def load(data_dir: Path) -> Cranfield:
    cran = load_cranfield(data_dir)
    docs = [d or "(empty)" for d in cran.docs]  # a few Cranfield records have no text
    return Cranfield(docs, cran.queries, cran.qrels)


def _top(scores: np.ndarray, k: int) -> np.ndarray:
    return np.argsort(-scores, axis=1, kind="stable")[:, :k]


def retrieval(data_dir: Path) -> None:
    cran = load(data_dir)
    with Engine.from_pretrained(default_model_path()) as e:
        docs = e.embed(cran.docs, truncate="end")
        queries = e.embed(cran.queries, truncate="end")
    qrels = {str(q): {str(d): g for d, g in j.items()} for q, j in cran.qrels.items()}
    qids = sorted(qrels)
    float_scores = queries @ docs.T

    def report(name: str, scores: np.ndarray, rescore_with: np.ndarray | None = None, how: str = "") -> None:
        top = _top(scores, 100)
        if rescore_with is not None:  # float query x (float or decoded) doc over the compressed top 100
            fs = np.take_along_axis(rescore_with, top, axis=1)
            top = np.take_along_axis(top, np.argsort(-fs, axis=1, kind="stable"), axis=1)
        runs = {str(q): [str(d) for d in top[q]] for q in range(len(queries))}
        m = mean_over(retrieval_scores(runs, qrels), qids)
        print(f"| {name}{how} | {m['ndcg@10']:.4f} | {m['recall@100']:.4f} |")

    print("| vectors | nDCG@10 | Recall@100 |\n|---|---|---|")
    report("float32", float_scores)
    fixed, calibrated = Calibration.fixed(1.0), Calibration.from_embeddings(docs)
    for label, cal in (("int8 fixed [-1,1]", fixed), ("int8 calibrated", calibrated)):
        cd, cq = stored_codes(docs, "int8", cal), stored_codes(queries, "int8", cal)
        codes = (cq @ cd.T).astype(np.float64)
        report(label, codes)
        report(
            label,
            codes,
            queries @ decoded(cd, "int8", cal).T,
            " + rescore: float query x decoded codes (index)",
        )
        report(label, codes, float_scores, " + rescore: float query x float docs")
    bd, bq = stored_codes(docs, "binary", fixed), stored_codes(queries, "binary", fixed)
    hamming_rank = (bq @ bd.T).astype(np.float64)  # = bits - 2 x Hamming
    report("binary (Hamming)", hamming_rank)
    report("binary (Hamming)", hamming_rank, queries @ bd.T, " + rescore: float query x +-1 bits (index)")
    report("binary (Hamming)", hamming_rank, float_scores, " + rescore: float query x float docs")


def cross_encoder_dir(dst: Path) -> Path:
    import shutil

    import transformers

    src = default_model_path()
    cfg = transformers.BertConfig.from_pretrained(src, num_labels=1)
    model = transformers.BertForSequenceClassification.from_pretrained(src, config=cfg)
    model.save_pretrained(dst, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt"):
        shutil.copy(src / name, dst / name)
    return dst


def throughput(data_dir: Path, n_queries: int, n_docs: int) -> None:
    from sentence_transformers import CrossEncoder

    cran = load(data_dir)
    with tempfile.TemporaryDirectory() as tmp:
        path = cross_encoder_dir(Path(tmp) / "minilm-ce")
        work = [(cran.queries[q], cran.docs[q * n_docs : (q + 1) * n_docs]) for q in range(n_queries)]
        pairs = n_queries * n_docs
        ce = CrossEncoder(str(path), device="cpu", max_length=512)
        ce.predict([(work[0][0], d) for d in work[0][1]])  # warm
        t = time.perf_counter()
        ref = [ce.predict([(q, d) for d in docs], batch_size=32) for q, docs in work]
        ce_s = time.perf_counter() - t
        with Engine.from_pretrained(path, max_num_batched_tokens=8192) as e:
            e.rerank(work[0][0], work[0][1])  # warm
            t = time.perf_counter()
            ours = [e.rerank(q, docs) for q, docs in work]
            es_s = time.perf_counter() - t
    diff = max(
        abs(r.relevance_score - float(ref_q[r.index]))
        for res, ref_q in zip(ours, ref, strict=True)
        for r in res
    )
    print(f"torch threads {torch.get_num_threads()}; {pairs} pairs, {n_docs} documents per query")
    print("| backend | pairs/s |\n|---|---|")
    print(f"| sentence-transformers CrossEncoder (batch 32) | {pairs / ce_s:.1f} |")
    print(f"| embedserve Engine.rerank | {pairs / es_s:.1f} |")
    print(f"max |score difference| {diff:.2e}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--data-dir", type=Path, default=Path(__file__).resolve().parents[2] / "shared/data/cranfield"
    )
    ap.add_argument("--queries", type=int, default=20)
    ap.add_argument("--docs", type=int, default=50)
    ap.add_argument("--only", choices=["retrieval", "throughput"], default=None)
    args = ap.parse_args()
    if args.only != "throughput":
        retrieval(args.data_dir)
    if args.only != "retrieval":
        throughput(args.data_dir, args.queries, args.docs)


if __name__ == "__main__":
    main()
