"""The run record: phases, skips and errors; the summary table printed last; JSON under $OUT."""

from __future__ import annotations

import json
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

TARGET_TOK_S = 21_000  # per chip: the TPU reference's 84,000 tokens/s over four chips
TARGET_RATIO = 1.5  # vs transformers on the same device
HEADLINE_SHAPE = "Qwen3-Embedding-8B"  # the targets are for this shape at 16,384 tokens


@dataclass
class Record:
    started: float = field(default_factory=time.time)
    meta: dict[str, Any] = field(default_factory=dict)
    parity: list[dict[str, Any]] = field(default_factory=list)
    throughput: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[dict[str, str]] = field(default_factory=list)
    errors: list[dict[str, str]] = field(default_factory=list)

    def skip(self, phase: str, reason: str) -> None:
        self.skipped.append({"phase": phase, "reason": reason})
        print(f"[skip] {phase}: {reason}", flush=True)

    def error(self, phase: str, exc: BaseException) -> None:
        tail = "".join(traceback.format_exception(exc))[-2000:]
        self.errors.append({"phase": phase, "error": repr(exc), "traceback": tail})
        print(f"[error] {phase}: {exc!r}\n{tail}", flush=True)

    def row(
        self, shape: str, length: int, result: dict[str, Any], flops_per_token: float, peaks: dict[str, Any]
    ) -> dict[str, Any]:
        row = {"shape": shape, "length": length, **result}
        row["tflops"] = row["tok_s"] * flops_per_token / 1e12
        row["mfu"] = {name: row["tflops"] / peak for name, peak in peaks.items() if peak}
        self.throughput.append(row)
        return row

    def find(self, shape: str, length: int, backend: str) -> dict[str, Any] | None:
        return next(
            (
                r
                for r in self.throughput
                if (r["shape"], r["length"], r["backend"]) == (shape, length, backend)
            ),
            None,
        )

    def verdict(self, headline: tuple[str, int]) -> dict[str, Any]:
        ours = self.find(*headline, "embedserve")
        theirs = self.find(*headline, "transformers-sdpa")
        parity_ok = bool(self.parity) and all(p.get("passed") for p in self.parity)
        ratio = ours["tok_s"] / theirs["tok_s"] if ours and theirs else None
        return {
            "headline": f"{headline[0]} at {headline[1]} tokens",
            "targets_apply": headline == (HEADLINE_SHAPE, 16384),
            "tok_s": ours["tok_s"] if ours else None,
            "tok_s_target": TARGET_TOK_S,
            "tok_s_met": bool(ours and ours["tok_s"] >= TARGET_TOK_S),
            "ratio_vs_transformers": ratio,
            "ratio_met": bool(ratio and ratio >= TARGET_RATIO),
            "parity_met": parity_ok,
        }


def _fmt(x: Any, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def summary(rec: Record, headline: tuple[str, int]) -> str:
    lines = [
        "",
        "=" * 100,
        "SUMMARY  " + " | ".join(f"{k}={v}" for k, v in rec.meta.get("device", {}).items()),
    ]
    lines.append(f"attention route: {rec.meta.get('attention')}")
    lines.append("")
    lines.append(
        f"{'shape':<22}{'tokens':>7}  {'backend':<18}{'reqs':>6}{'tok/s':>10}{'req/s':>8}"
        f"{'p50 s':>8}{'p95 s':>8}{'peak GiB':>10}{'TFLOP/s':>9}{'of 989':>8}{'of meas.':>9}"
    )
    for r in rec.throughput:
        mfu = r.get("mfu", {})
        lines.append(
            f"{r['shape']:<22}{r['length']:>7}  {r['backend']:<18}{r['completed']:>6}{r['tok_s']:>10.0f}"
            f"{r['req_s']:>8.2f}{r['p50_s']:>8.1f}{r['p95_s']:>8.1f}{_fmt(r.get('peak_gib'), '.1f'):>10}"
            f"{r['tflops']:>9.0f}{_fmt(mfu.get('datasheet'), '.1%'):>8}{_fmt(mfu.get('measured'), '.1%'):>9}"
            + ("  (partial: time budget)" if r.get("timed_out") else "")
        )
    lines.append("")
    for p in rec.parity:
        cos = ", ".join(f"{n}: {c:.6f}" for n, c in p["cosine"].items())
        lines.append(
            f"parity {p['shape']} bf16 engine vs fp32 transformers: {cos}  "
            f"-> {'PASS' if p['passed'] else 'FAIL'} (bar {p['bar']})"
        )
    for r in rec.throughput:
        if r["backend"] == "embedserve":
            hf = rec.find(r["shape"], r["length"], "transformers-sdpa")
            if hf:
                lines.append(
                    f"ratio {r['shape']} {r['length']}: embedserve / transformers = "
                    f"{r['tok_s'] / hf['tok_s']:.2f}x  (cosine of their vectors: "
                    f"{_fmt(hf.get('cosine_vs_engine'), '.5f')})"
                )
    v = rec.verdict(headline)
    lines.append("")
    if not v["targets_apply"]:
        lines.append(f"(targets are set for {HEADLINE_SHAPE} at 16384 tokens, not for this run's shapes)")
    lines.append(
        f"TARGET {v['headline']}: tok/s {_fmt(v['tok_s'], '.0f')} (>= {TARGET_TOK_S}: "
        f"{'met' if v['tok_s_met'] else 'NOT met'}); vs transformers "
        f"{_fmt(v['ratio_vs_transformers'], '.2f')}x (>= {TARGET_RATIO}: "
        f"{'met' if v['ratio_met'] else 'NOT met'}); parity {'met' if v['parity_met'] else 'NOT met'}"
    )
    for s in rec.skipped:
        lines.append(f"skipped {s['phase']}: {s['reason']}")
    for e in rec.errors:
        lines.append(f"ERROR {e['phase']}: {e['error']}")
    lines.append(f"wall time {time.time() - rec.started:.0f} s")
    return "\n".join(lines)


def _plain(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items() if not isinstance(v, np.ndarray)}
    if isinstance(x, list):
        return [_plain(v) for v in x]
    if isinstance(x, np.generic):
        return x.item()
    return x


def write(rec: Record, out: Path, headline: tuple[str, int], table: str | None = None) -> Path:
    """gpu_bench.json (after every phase, so a killed run leaves its results) and summary.txt."""
    out.mkdir(parents=True, exist_ok=True)
    data = {
        "meta": rec.meta,
        "verdict": rec.verdict(headline),
        "parity": rec.parity,
        "throughput": rec.throughput,
        "skipped": rec.skipped,
        "errors": rec.errors,
        "wall_s": time.time() - rec.started,
    }
    path = out / "gpu_bench.json"
    path.write_text(json.dumps(_plain(data), indent=2))
    if table is not None:
        (out / "summary.txt").write_text(table + "\n")
    return path
