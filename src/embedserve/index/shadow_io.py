"""Inputs and outputs of `migrate shadow`: query set, qrels, report.json and report.md."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from embedserve.index.documents import read_documents
from embedserve.index.errors import DocumentError


def load_queries(path: str | Path) -> dict[str, str]:
    """A .jsonl query set: one `{"id": ..., "text": ...}` per line."""
    if Path(path).suffix != ".jsonl":
        raise DocumentError(f"{path}: queries must be a .jsonl file with 'id' and 'text' per line")
    return {q.doc_id: q.text for q in read_documents([path])}


def load_qrels(path: str | Path) -> dict[str, dict[str, int]]:
    """Relevance judgments: `qid docid gain` (BEIR tsv, header allowed) or TREC `qid 0 docid gain`.
    Gains <= 0 are judged non-relevant."""
    qrels: dict[str, dict[str, int]] = {}
    for line_no, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        cols = line.split()
        if not cols:
            continue
        if len(cols) not in (3, 4):
            raise DocumentError(f"{path}:{line_no}: expected 'qid docid gain' or 'qid 0 docid gain'")
        qid, did, gain = (cols[0], cols[1], cols[2]) if len(cols) == 3 else (cols[0], cols[2], cols[3])
        try:
            value = int(float(gain))
        except ValueError:
            if line_no == 1:  # a header such as "query-id corpus-id score"
                continue
            raise DocumentError(f"{path}:{line_no}: gain {gain!r} is not a number") from None
        qrels.setdefault(qid, {})[did] = value
    if not qrels:
        raise DocumentError(f"{path}: no judgments")
    return qrels


def _side_line(side: dict[str, Any]) -> str:
    return (
        f"- **{side['role']}**: collection `{side['collection']}` ({side['rows']} rows, "
        f"{side['dimension']}-d) — model "
        f"`{side['model']}` (version `{side['model_version']}`), dtype `{side['dtype']}`, profile "
        f"`{side['backend_profile']}`, schema `{side['embedding_schema']}`"
    )


def render_markdown(report: dict[str, Any]) -> str:
    ov = report["top10_overlap"]
    lines = [
        "# Shadow report: live vs shadow",
        "",
        _side_line(report["live"]),
        _side_line(report["shadow"]),
        "",
        f"{report['num_queries']} queries, each embedded by its own side's model and searched in its "
        "own index; documents ranked by their best chunk.",
        "",
        "| top-10 overlap | mean | p10 | min | identical top-10 |",
        "|---|--:|--:|--:|--:|",
        f"| live vs shadow | {ov['mean']:.4f} | {ov['p10']:.4f} | {ov['min']:.4f} "
        f"| {ov['identical_share']:.1%} |",
    ]
    if "retrieval" in report:
        lines += [
            "",
            f"Retrieval quality over {report['num_judged_queries']} judged queries:",
            "",
            "| metric | live → shadow (delta) |",
            "|---|--:|",
        ]
        for metric, m in report["retrieval"].items():
            lines.append(f"| {metric} | {m['live']:.4f} → {m['shadow']:.4f} ({m['delta']:+.4f}) |")
    return "\n".join(lines) + "\n"


def write_report(report: dict[str, Any], out_dir: str | Path) -> tuple[Path, Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    js, md = out / "shadow_report.json", out / "shadow_report.md"
    js.write_text(json.dumps(report, indent=2) + "\n")
    md.write_text(render_markdown(report))
    return js, md
