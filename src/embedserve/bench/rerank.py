"""`embedserve bench --scenario rerank`: rerank throughput side by side, one run.

Each request is one query (16 tokens) with `--rerank-documents` documents of each `--lengths`
length (real or random text, as the matrix), sent `--requests` times one after another per
target. Targets are rerankers in the shared grammar (embedders/scorers.py, docs/specs.md): `engine:DIR?opts`,
`sentence-transformers:DIR` (CrossEncoder.predict), `hf:DIR`, `http://HOST:PORT` (/v1/rerank).
Reported per length: pairs/s, request latency p50 / p95, the ratio to the first target and the
largest score difference to it on the first request.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from embedserve.bench.inputs import TextMaker
from embedserve.bench.machine import machine_info
from embedserve.bench.stats import percentile
from embedserve.embedders.scorers import open_scorer
from embedserve.embedders.spec import parse_spec
from embedserve.errors import InvalidInputError

QUERY_TOKENS = 16


def _tokenizer(args: argparse.Namespace) -> Path:
    if args.tokenizer is not None:
        return Path(args.tokenizer)
    for t in args.target:
        model_dir = parse_spec(t, "rerank").model_dir
        if model_dir is not None and (model_dir / "tokenizer.json").exists():
            return model_dir / "tokenizer.json"
    raise InvalidInputError("pass --tokenizer: no local target has a tokenizer.json")


def run_rerank_bench(args: argparse.Namespace) -> int:
    maker = TextMaker(_tokenizer(args), args.text, args.data_dir)
    rng = np.random.default_rng(args.seed)
    lengths = args.lengths or [256]
    work = {
        n: (maker.make(QUERY_TOKENS, rng), [maker.make(n, rng) for _ in range(args.rerank_documents)])
        for n in lengths
    }
    rows: list[dict[str, Any]] = []
    first: dict[int, list[float]] = {}
    for spec in args.target:
        score, close = open_scorer(spec)
        try:
            for n, (query, docs) in work.items():
                score(query, docs)  # warm-up
                latencies = []
                start = time.perf_counter()
                scores: list[float] = []
                for _ in range(args.requests):
                    t = time.perf_counter()
                    scores = score(query, docs)
                    latencies.append(time.perf_counter() - t)
                wall = time.perf_counter() - start
                ref = first.setdefault(n, scores)
                rows.append(
                    {
                        "target": spec,
                        "doc_tokens": n,
                        "documents": len(docs),
                        "requests": args.requests,
                        "pairs_per_s": args.requests * len(docs) / wall,
                        "p50_ms": 1000 * percentile(latencies, 50),
                        "p95_ms": 1000 * percentile(latencies, 95),
                        "max_abs_diff_to_first": max(abs(a - b) for a, b in zip(scores, ref, strict=True)),
                    }
                )
        finally:
            close()
    _write(args.out, rows)
    return 0


def _write(out: Path, rows: list[dict[str, Any]]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "rerank.json").write_text(json.dumps({"machine": machine_info(), "rows": rows}, indent=2))
    lines = ["| target | doc tokens | pairs/s | x first | p50 ms | p95 ms | max abs diff to first |"]
    lines.append("|---|---|---|---|---|---|---|")
    base = {r["doc_tokens"]: r["pairs_per_s"] for r in reversed(rows)}  # the first target's
    for r in rows:
        lines.append(
            f"| {r['target']} | {r['doc_tokens']} | {r['pairs_per_s']:.1f} | "
            f"{r['pairs_per_s'] / base[r['doc_tokens']]:.2f} | {r['p50_ms']:.1f} | {r['p95_ms']:.1f} | "
            f"{r['max_abs_diff_to_first']:.2e} |"
        )
    (out / "report.md").write_text("# Rerank throughput\n\n" + "\n".join(lines) + "\n")
    print("\n".join(lines))
