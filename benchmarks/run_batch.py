"""`embedserve run-batch` at scale: lines/s and peak RSS over a large input (RSS sampled as the
output grows: flat means bounded memory), and throughput against `embedserve embed` on the same
texts (both minus their one-text run: model load and warm-up apart).

    python benchmarks/run_batch.py --lines 100000 --compare 2000 [--model DIR]

Measured (2 CPU cores shared with other work, so rates are rough; one text per line):
- all-MiniLM-L6-v2, 100,000 lines (2026-12-05, since models/linear.py `padded_rows`): 303 s
  (330 lines/s with load), peak RSS 747 MB; RSS 624 / 649 / 730 / 730 / 738 MB at 10 / 25 / 50 /
  75 / 95% of the output: flat. Before it: 385 s, RSS 1156 MB at 10%, 1582 at 50%, 1805 at 95%,
  still growing: oneDNN built a primitive for every step's row count and their churn fragmented
  the C heap (benchmarks/engine_rss.py); run-batch's Python heap was flat (tracemalloc: ~0.9 MB
  over 16,000 lines).
- tiny Qwen3 (tests' qwen3_dir), 100,000 lines: 294 s; RSS 997 / 1156 / 1166 / 1165 MB at
  10 / 25 / 75 / 95% of the output.
- 2,000 texts, load apart: run-batch 308-333 texts/s, `embed` 333-363 texts/s (MiniLM); 2026-12-05
  in one run: 363 and 363 texts/s.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WORDS = ["the", "of", "engine", "batch", "token", "model", "vector", "query", "document", "server", "pool"]


def texts(n: int) -> list[str]:
    rng = random.Random(0)
    return [f"{i} " + " ".join(rng.choices(WORDS, k=rng.randint(6, 14))) for i in range(n)]


def write_input(path: Path, items: list[str]) -> None:
    with path.open("w") as f:
        for i, t in enumerate(items):
            line = {"custom_id": f"r{i}", "method": "POST", "url": "/v1/embeddings", "body": {"input": t}}
            f.write(json.dumps(line) + "\n")


def rss_mb(pid: int) -> float:
    try:
        for row in Path(f"/proc/{pid}/status").read_text().splitlines():
            if row.startswith("VmRSS:"):
                return int(row.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def timed(cmd: list[str], output: Path | None = None) -> tuple[float, float, list[tuple[int, float]]]:
    """(seconds, peak RSS MB, [(output bytes, RSS MB)] sampled every 0.5 s)."""
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    samples: list[tuple[int, float]] = []
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)  # the child's own rusage once it ends
        if pid:
            break
        if output is not None and output.exists():
            samples.append((output.stat().st_size, rss_mb(proc.pid)))
        time.sleep(0.5)
    seconds = time.monotonic() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(cmd[:4])} ... exited {proc.returncode}")
    peak = usage.ru_maxrss / 1024
    return seconds, peak, samples


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lines", type=int, default=100_000)
    p.add_argument("--compare", type=int, default=2000, help="texts for the run-batch vs embed comparison")
    p.add_argument("--model", default=None)
    a = p.parse_args()
    model = ["--model", a.model] if a.model else []
    base = [sys.executable, "-m", "embedserve"]
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        items = texts(max(a.lines, a.compare))

        def batch(n: int) -> tuple[float, float, list[tuple[int, float]]]:
            write_input(tmp / "in.jsonl", items[:n])
            for f in ("out.jsonl", "out.errors.jsonl"):
                (tmp / f).unlink(missing_ok=True)
            out = tmp / "out.jsonl"
            return timed([*base, "run-batch", "-i", str(tmp / "in.jsonl"), "-o", str(out), *model], out)

        s, peak, samples = batch(a.lines)
        size = max((b for b, _ in samples), default=1) or 1
        print(
            f"run-batch {a.lines} lines: {s:.1f} s ({a.lines / s:.0f} lines/s, model load included), "
            f"peak RSS {peak:.0f} MB"
        )
        for q in (0.1, 0.25, 0.5, 0.75, 0.95):
            r = next((r for b, r in samples if b >= q * size), samples[-1][1] if samples else 0.0)
            print(f"  RSS at {q:.0%} of the output: {r:.0f} MB")
        one_batch, _, _ = batch(1)
        k_batch, _, _ = batch(a.compare)
        one_embed, _, _ = timed([*base, "embed", *model, items[0]])
        k_embed, _, _ = timed([*base, "embed", *model, *items[: a.compare]])
        n = a.compare - 1
        print(
            f"{a.compare} texts, load apart: run-batch {n / max(k_batch - one_batch, 1e-9):.0f} texts/s, "
            f"embed {n / max(k_embed - one_embed, 1e-9):.0f} texts/s "
            f"(wall: run-batch {k_batch:.1f} s vs 1 line {one_batch:.1f} s; embed {k_embed:.1f} s vs 1 text "
            f"{one_embed:.1f} s)"
        )


if __name__ == "__main__":
    main()
