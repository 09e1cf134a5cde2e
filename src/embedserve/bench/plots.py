"""PNG plots: tok/s vs token budget per bucket, p95 vs concurrency per bucket, interference CDF."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from embedserve.bench.interference import FLOOD, IDLE
from embedserve.bench.stats import ALL
from embedserve.lengths import BUCKET_NAMES

NA = "n/a"


def _buckets(rows: list[dict[str, Any]]) -> list[str]:
    present = {r["length_bucket"] for r in rows}
    return [b for b in (*BUCKET_NAMES, ALL) if b in present]


def _ok(v: Any) -> bool:
    return isinstance(v, (int, float)) and v == v  # NaN-free number


def _figure(n: int) -> tuple[Any, list[Any]]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, n, figsize=(5.5 * n, 4.2), squeeze=False)
    return fig, list(axes[0])


def _save(fig: Any, path: Path) -> None:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def plot_tok_s_vs_budget(rows: list[dict[str, Any]], path: Path) -> bool:
    rows = [r for r in rows if r["scenario"] == "matrix" and _ok(r["tok_per_s"])]
    if not rows:
        return False
    buckets = _buckets(rows)
    budgets = sorted({r["token_budget"] for r in rows if r["token_budget"] != NA})
    fig, axes = _figure(len(buckets))
    for ax, bucket in zip(axes, buckets, strict=True):
        lines: dict[str, list[tuple[int, float]]] = defaultdict(list)
        flat_labels = set()
        for r in rows:
            if r["length_bucket"] == bucket:
                label = f"{r['target']} len={r['length']} c={r['concurrency']}"
                if r["token_budget"] == NA:  # one value for every budget: a flat reference line
                    flat_labels.add(label)
                    lines[label] += [(b, r["tok_per_s"]) for b in budgets or [0]]
                else:
                    lines[label].append((r["token_budget"], r["tok_per_s"]))
        for label, pts in lines.items():
            xs, ys = zip(*sorted(pts), strict=True)
            flat = label in flat_labels
            ax.plot(xs, ys, "--" if flat else "-", marker="" if flat else "o", label=label)
        ax.set(title=f"bucket {bucket}", xlabel="token budget (tokens/step)", ylabel="input tok/s")
        if budgets:
            ax.set_xscale("log", base=2)
        ax.legend(fontsize=6)
    _save(fig, path)
    return True


def plot_p95_vs_concurrency(rows: list[dict[str, Any]], path: Path) -> bool:
    rows = [r for r in rows if r["scenario"] == "matrix" and _ok(r["p95_ms"])]
    if not rows:
        return False
    buckets = _buckets(rows)
    fig, axes = _figure(len(buckets))
    for ax, bucket in zip(axes, buckets, strict=True):
        lines: dict[str, list[tuple[int, float]]] = defaultdict(list)
        for r in rows:
            if r["length_bucket"] == bucket:
                label = f"{r['target']} len={r['length']} budget={r['token_budget']}"
                lines[label].append((r["concurrency"], r["p95_ms"]))
        for label, pts in lines.items():
            xs, ys = zip(*sorted(pts), strict=True)
            ax.plot(xs, ys, marker="o", label=label)
        ax.set(title=f"bucket {bucket}", xlabel="concurrency", ylabel="p95 latency (ms)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.legend(fontsize=6)
    _save(fig, path)
    return True


def plot_interference_cdf(latencies: list[dict[str, Any]], path: Path) -> bool:
    if not latencies:
        return False
    fig, axes = _figure(1)
    ax = axes[0]
    for entry in latencies:
        xs = entry["latencies_ms"]
        if not xs:
            continue
        ys = [(i + 1) / len(xs) for i in range(len(xs))]
        style = "--" if entry["scenario"] == IDLE else "-"
        phase = "idle" if entry["scenario"] == IDLE else "under flood" if entry["scenario"] == FLOOD else ""
        budget = entry["token_budget"] if entry["token_budget"] is not None else NA
        ax.step(xs, ys, style, where="post", label=f"{entry['target']} budget={budget} {phase}")
    ax.set(title="short-query latency CDF", xlabel="latency (ms)", ylabel="fraction of queries")
    ax.set_xscale("log")
    ax.legend(fontsize=7)
    _save(fig, path)
    return True


def write_plots(out: Path, rows: list[dict[str, Any]], latencies: list[dict[str, Any]]) -> list[str]:
    """Write the plots that have data; returns their file names."""
    made = {
        "tok_s_vs_budget.png": plot_tok_s_vs_budget(rows, out / "tok_s_vs_budget.png"),
        "p95_vs_concurrency.png": plot_p95_vs_concurrency(rows, out / "p95_vs_concurrency.png"),
        "interference_cdf.png": plot_interference_cdf(latencies, out / "interference_cdf.png"),
    }
    return [name for name, ok in made.items() if ok]
