"""report.json (every number) and report.md (a table per dataset, one row per length bucket)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from embedserve.parity.evaluate import SPARSE
from embedserve.parity.gate import Check

PASS, FAIL, NONE = "✅ pass", "❌ FAIL", "-"


def _f(value: Any, digits: int = 8) -> str:
    return f"{value:.{digits}f}" if isinstance(value, (int, float)) else NONE


def _pair(retrieval: dict[str, Any] | None, metric: str) -> str:
    if not retrieval:
        return NONE
    m = retrieval[metric]
    return f"{m['reference']:.4f} → {m['candidate']:.4f} ({m['candidate'] - m['reference']:+.4f})"


def _side_line(label: str, side: dict[str, Any]) -> str:
    schema = side.get("embedding_schema")
    return (
        f"- **{label}**: `{side.get('spec')}` — model `{side.get('model')}` "
        f"(version `{side.get('model_version')}`), dtype `{side.get('dtype')}`, "
        f"profile `{side.get('backend_profile')}`, schema `{json.dumps(schema)}`"
    )


def _mark(checks: list[Check], scope: str) -> str:
    mine = [c for c in checks if c.scope == scope]
    if not mine:
        return NONE
    return PASS if all(c.passed for c in mine) else FAIL


def _dataset_table(name: str, entry: dict[str, Any], checks: list[Check]) -> list[str]:
    speed = {
        side: "vectors from the cache" if t["cached_items"] else f"{t['tokens_per_s']:.0f} tok/s"
        for side, t in entry["timing"].items()
    }
    docs = entry["lengths"]["docs"]
    lines = [
        f"### {name}",
        "",
        f"{entry['num_docs']} documents, {entry['num_queries']} queries "
        f"({entry['num_judged_queries']} judged); tokens per document (min / median / max) "
        f"{docs.get('min')} / {docs.get('median')} / {docs.get('max')}; limit {entry['lengths']['limit']}. "
        f"Reference {speed['reference']}, candidate {speed['candidate']}.",
        "",
    ]
    if "buckets" not in entry:
        failed = [c.describe() for c in checks if c.scope == name]
        return [*lines, *[f"**{f}**" for f in failed], ""]
    lines += [
        "| bucket | texts | queries | truncated | cos p50 | cos p01 | cos min | top-10 overlap mean (worst) "
        "| nDCG@10 ref → cand | R@10 ref → cand | R@100 ref → cand | gate |",
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|",
    ]
    for bucket, e in entry["buckets"].items():
        cos = e["vector_cosine"]
        ov = e.get("top10_overlap")
        overlap = f"{ov['mean']:.4f} ({ov['worst']:.2f})" if ov else NONE
        ret = e.get("retrieval")
        label = f"**{bucket}**" if bucket == "overall" else bucket
        lines.append(
            f"| {label} | {e['num_texts']} | {e['num_queries']} | {e['truncated']} | {_f(cos.get('p50'))} "
            f"| {_f(cos.get('p01'))} | {_f(cos.get('min'))} | {overlap} | {_pair(ret, 'ndcg@10')} "
            f"| {_pair(ret, 'recall@10')} | {_pair(ret, 'recall@100')} "
            f"| {_mark(checks, f'{name}/{bucket}')} |"
        )
    sparse = [(b, e[SPARSE]) for b, e in entry["buckets"].items() if SPARSE in e]
    if sparse:  # SPLADE vectors: their non-zero id sets and weights
        lines += ["", "| bucket | non-zero ids Jaccard p50 / p01 / min | equal id sets | max weight diff |",
                  "|---|--:|--:|--:|"]  # fmt: skip
        for bucket, s in sparse:
            j = s["index_jaccard"]
            lines.append(
                f"| {bucket} | {_f(j.get('p50'))} / {_f(j.get('p01'))} / {_f(j.get('min'))} "
                f"| {s['equal_index_sets']:.4f} | {s['max_abs_diff']:.2e} |"
            )
    return [*lines, ""]


def _scenario_table(result: dict[str, Any], checks: list[Check]) -> list[str]:
    rows = [
        ("long input tokens", result["long_tokens"]),
        ("concurrent requests", result["num_requests"]),
        ("other requests' tokens [min, max, total]", result["other_tokens"]),
        ("KV cache (blocks / tokens)", f"{result['kv_blocks']} / {result['kv_tokens']}"),
        ("per-step token budget", result["max_num_batched_tokens"]),
        ("preemptions (engine count)", result["preemptions"]),
        ("long input preempted (times)", result["long_input_preemptions"]),
        ("requests preempted", result["requests_preempted"]),
        ("cosine long: pressured vs alone", _f(result["cosine_long_vs_alone"])),
        ("cosine long: pressured vs reference", _f(result["cosine_long_vs_reference"])),
        ("cosine long: alone vs reference", _f(result["cosine_alone_vs_reference"])),
        ("cosine others vs reference (min)", _f(result["cosine_others_vs_reference_min"])),
        ("gate (min cosine >= bound, preemptions > 0)", _mark(checks, "scenario/preemption")),
    ]
    return ["### scenario: preemption", "", "| | |", "|---|--:|", *[f"| {k} | {v} |" for k, v in rows], ""]


def render_markdown(report: dict[str, Any], checks: list[Check]) -> str:
    verdict = "PASS" if report["passed"] else "FAIL"
    gate = report["gate"]
    lines = [
        f"## embedserve parity: {verdict}",
        "",
        _side_line("reference", report["reference"]),
        _side_line("candidate", report["candidate"]),
        f"- **gate**: profile `{gate['profile'] or 'text'}`, thresholds `{json.dumps(gate['default'])}`"
        + (f", bucket overrides `{json.dumps(gate['buckets'])}`" if gate["buckets"] else ""),
        f"- token lengths measured with `{report['length_tokenizer']}`; run took {report['duration_s']} s",
        "",
    ]
    for name, entry in report["datasets"].items():
        lines += _dataset_table(name, entry, checks)
    if "scenarios" in report:
        lines += _scenario_table(report["scenarios"]["preemption"], checks)
    failed = [c for c in checks if not c.passed]
    if failed:
        lines += ["### failed checks", "", *[f"- `{c.describe()}`" for c in failed], ""]
    return "\n".join(lines)


def write_report(report: dict[str, Any], checks: list[Check], out: Path) -> tuple[Path, Path]:
    out.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out / "report.json", out / "report.md"
    json_path.write_text(json.dumps(report, indent=2, default=str) + "\n", encoding="utf-8")
    md_path.write_text(render_markdown(report, checks), encoding="utf-8")
    return json_path, md_path
