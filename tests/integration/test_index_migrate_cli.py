"""`embedserve migrate` between two tiny models on real text with known-item qrels (Python's
help() topics, as the built-in `pydocs` dataset pairs them): build a shadow index, shadow
report with qrels, cutover, rollback (each step through the CLI)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from embedserve.cli import main
from tests.helpers.real_text import known_items

NUM_DOCS = 60  # every usable topic
CHUNKING = ["--max-tokens", "128", "--overlap", "16", "--progress", "off"]


def _write_subset(tmp: Path) -> tuple[Path, Path, Path]:
    corpus, questions = known_items()
    ids = list(corpus)[:NUM_DOCS]
    assert len(ids) == NUM_DOCS
    docs, queries, qrels = tmp / "docs.jsonl", tmp / "queries.jsonl", tmp / "qrels.tsv"
    docs.write_text("".join(json.dumps({"id": i, "text": corpus[i]}) + "\n" for i in ids))
    queries.write_text("".join(json.dumps({"id": i, "text": questions[i]}) + "\n" for i in ids))
    qrels.write_text("".join(f"{i}\t{i}\t1\n" for i in ids))
    return docs, queries, qrels


def _run(capsys: pytest.CaptureFixture[str], *args: str | Path) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_build_shadow_cutover_rollback(
    qwen3_dir: Path, qwen2_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    docs, queries, qrels = _write_subset(tmp_path)
    store = ["--store", str(tmp_path / "m.db")]
    assert _run(capsys, "index", docs, *store, "--model", qwen3_dir, *CHUNKING)[0] == 0
    code, out, err = _run(capsys, "index", docs, *store, "--model", qwen2_dir, *CHUNKING)
    assert code == 2 and "migrate build" in err
    code, out, _ = _run(capsys, "migrate", "build", docs, *store, "--model", qwen2_dir, *CHUNKING)
    assert code == 0 and "'shadow' ->" in out
    status = json.loads(_run(capsys, "migrate", "status", *store)[1])
    old, new = status["live"]["collection"], status["shadow"]["collection"]
    assert old != new and status["live"]["rows"] > NUM_DOCS and status["shadow"]["rows"] > NUM_DOCS

    report_dir = tmp_path / "report"
    code, out, _ = _run(
        capsys, "migrate", "shadow", *store, "--live-model", qwen3_dir, "--model", qwen2_dir,
        "--queries", queries, "--qrels", qrels, "--out", report_dir,
    )  # fmt: skip
    assert code == 0 and "| live vs shadow |" in out and "| ndcg@10 |" in out
    report = json.loads((report_dir / "shadow_report.json").read_text())
    assert report["live"]["collection"] == old and report["shadow"]["collection"] == new
    assert report["num_judged_queries"] == report["num_queries"] > 10
    # Two unrelated random models: their top-10 lists agree far less than one model with itself
    # (1.0); with 60 documents a top 10 is a sixth of the corpus, so chance alone gives ~0.17.
    assert 0.0 <= report["top10_overlap"]["mean"] < 0.7
    assert set(report["retrieval"]) == {"ndcg@10", "recall@10", "recall@100"}
    # Swapped sides: each index must be searched with its own model.
    code, _, err = _run(
        capsys,
        "migrate",
        "shadow",
        *store,
        "--live-model",
        qwen2_dir,
        "--model",
        qwen3_dir,
        "--queries",
        queries,
    )
    assert code == 2 and "refusing to search" in err

    assert json.loads(_run(capsys, "migrate", "cutover", *store)[1]) == {"live": new, "previous": old}
    code, out, _ = _run(capsys, "search", "shock wave", *store, "--model", qwen2_dir, "--json", "-k", "3")
    assert code == 0 and len(json.loads(out)) == 3
    assert _run(capsys, "search", "shock wave", *store, "--model", qwen3_dir)[0] == 2
    assert json.loads(_run(capsys, "migrate", "rollback", *store)[1]) == {"live": old, "shadow": new}
    assert _run(capsys, "search", "shock wave", *store, "--model", qwen3_dir)[0] == 0
    code, _, err = _run(capsys, "migrate", "rollback", *store)
    assert code == 2 and "nothing to roll back" in err
