"""`embedserve parity --task rerank`: engine vs references on Cranfield (skips without the data)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from embedserve.cli import main
from embedserve.parity.rerank import kendall_tau
from tests.helpers.cranfield import DATA_DIR
from tests.helpers.shared_data import needs_shared_data
from tests.helpers.tiny_rerankers import build_cross_encoder, build_qwen3_reranker

needs_cranfield = needs_shared_data("cranfield")


def test_kendall_tau() -> None:
    assert kendall_tau([1, 2, 3], [10, 20, 30]) == 1.0
    assert kendall_tau([1, 2, 3], [3, 2, 1]) == -1.0
    assert abs(kendall_tau([1, 2, 3, 4], [1, 3, 2, 4]) - 2 / 3) < 1e-12


@needs_cranfield
@pytest.mark.parametrize("kind", ["bert", "qwen3"])
def test_engine_passes_the_rerank_gate(tmp_path: Path, kind: str) -> None:
    if kind == "bert":
        model = build_cross_encoder(tmp_path / "ce", "bert")
        reference = f"sentence-transformers:{model}"
    else:
        model = build_qwen3_reranker(tmp_path / "tiny-qwen3-reranker")
        reference = f"hf:{model}"
    out = tmp_path / "out"
    code = main(
        [
            "parity",
            "--task",
            "rerank",
            "--reference",
            reference,
            "--candidate",
            f"engine:{model}?max_num_batched_tokens=1024",
            "--dataset",
            "cranfield?queries=3",
            "--data-dir",
            str(DATA_DIR.parent),
            "--rerank-depth",
            "6",
            "--rerank-max-diff",
            "1e-5",
            "--out",
            str(out),
        ]
    )
    report = json.loads((out / "report.json").read_text())
    row = report["datasets"][0]
    assert code == 0, row
    assert row["pairs"] == 18 and row["kendall_tau_min"] > 0.99
    assert "Rerank parity" in (out / "report.md").read_text()
