"""`embedserve bench --scenario rerank`: engine vs CrossEncoder side by side on a tiny cross-encoder."""

from __future__ import annotations

import json
from pathlib import Path

from embedserve.cli import main
from tests.helpers.tiny_rerankers import build_cross_encoder


def test_rerank_bench_reports_pairs_per_second(tmp_path: Path) -> None:
    model = build_cross_encoder(tmp_path / "ce", "bert")
    out = tmp_path / "out"
    argv = ["bench", "--scenario", "rerank", "--target", f"engine:{model}?max_num_batched_tokens=512"]
    argv += ["--target", f"sentence-transformers:{model}", "--lengths", "24,48", "--rerank-documents", "4"]
    argv += ["--requests", "2", "--out", str(out)]
    assert main(argv) == 0
    rows = json.loads((out / "rerank.json").read_text())["rows"]
    assert [(r["doc_tokens"], r["documents"]) for r in rows] == [(24, 4), (48, 4)] * 2
    assert all(r["pairs_per_s"] > 0 for r in rows)
    assert max(r["max_abs_diff_to_first"] for r in rows) < 1e-5  # same model, same scores
    assert "pairs/s" in (out / "report.md").read_text()
