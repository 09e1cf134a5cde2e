"""SPLADE sparse vectors: the engine against sentence-transformers' SparseEncoder on one directory,
alternating in one process (tok/s, medians over rounds), with the largest value difference and
whether the non-zero terms agree.

    python benchmarks/sparse_bench.py DIR [--tokens 512] [--inputs 32] [--rounds 3] [--batch 8]

DIR: a SparseEncoder directory (tests/helpers/tiny_sparse.py `build_splade` makes one from
all-MiniLM-L6-v2's real encoder and a seeded head). `--build N`: build it there first (if
absent) with N positions (MiniLM's 512 tiled; N = 8192 for an 8K-token run).

    python benchmarks/sparse_bench.py /tmp/splade-8k --build 8192 --tokens 8192 --inputs 4
    python benchmarks/sparse_bench.py /tmp/splade-8k --tokens 8192 --rss   # peak memory per arm

`--rss`: each arm in a fresh process embeds one input of `--tokens`; its peak RSS after the
model loaded and after the input (sentence-transformers holds the [tokens, vocab] logits; the
engine folds them a slice at a time).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

WORDS = ["engine", "vector", "sparse", "term", "weight", "query", "document", "index", "model", "token"]


def texts(n: int, tokens: int) -> list[str]:
    rng = np.random.default_rng(0)
    return [f"{i} " + " ".join(rng.choice(WORDS, size=tokens - 3)) for i in range(n)]


def peak_rss(arm: str, model_dir: str, tokens: int) -> str:
    """One arm in this process (run by `--rss` in a fresh one): peak RSS after load and after
    one input of `tokens`."""
    import resource

    items = texts(1, tokens)
    if arm == "SparseEncoder":
        from sentence_transformers import SparseEncoder

        model = SparseEncoder(model_dir, device="cpu")
        loaded = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        model.encode(items, batch_size=1, convert_to_tensor=True)
    else:
        from embedserve import Engine

        engine = Engine.from_pretrained(model_dir, max_num_batched_tokens=max(2048, tokens))
        loaded = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        engine.embed(items)
        engine.close()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    after = f"{peak / 1024:.0f} MB after one {tokens}-token input"
    return f"{arm}: peak RSS {loaded / 1024:.0f} MB after load, {after}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dir")
    p.add_argument("--tokens", type=int, default=512)
    p.add_argument("--inputs", type=int, default=32)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--batch", type=int, default=8, help="SparseEncoder's batch size")
    p.add_argument("--build", type=int, default=None, metavar="POSITIONS", help="build DIR first")
    p.add_argument("--rss", action="store_true", help="peak memory of each arm, a fresh process each")
    p.add_argument("--arm", default=None, help=argparse.SUPPRESS)  # --rss's child
    a = p.parse_args()
    if a.arm is not None:
        print(peak_rss(a.arm, a.dir, a.tokens))
        return
    if a.rss:
        import subprocess
        import sys

        for arm in ("SparseEncoder", "embedserve"):
            cmd = [sys.executable, __file__, a.dir, "--tokens", str(a.tokens), "--arm", arm]
            print(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip())
        return
    if a.build is not None:
        import sys
        from pathlib import Path

        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the test fixtures' builder
        from tests.helpers.tiny_sparse import build_splade

        build_splade(Path(a.dir), positions=a.build)

    from sentence_transformers import SparseEncoder

    from embedserve import Engine

    items = texts(a.inputs, a.tokens)
    ref_model = SparseEncoder(a.dir, device="cpu")
    rates: dict[str, list[float]] = {"SparseEncoder": [], "embedserve": []}
    with Engine.from_pretrained(a.dir, max_num_batched_tokens=max(2048, a.tokens)) as engine:
        n_tokens = sum(len(t.token_ids) for t in engine.renderer.text(items))
        engine.embed(items[:2])  # warm
        for _ in range(a.rounds):
            t = time.perf_counter()
            ref = ref_model.encode(items, batch_size=a.batch, convert_to_tensor=True).to_dense().numpy()
            rates["SparseEncoder"].append(n_tokens / (time.perf_counter() - t))
            t = time.perf_counter()
            got = np.stack(engine.embed(items))
            rates["embedserve"].append(n_tokens / (time.perf_counter() - t))
    same_terms = all(
        np.array_equal(np.flatnonzero(g), np.flatnonzero(r)) for g, r in zip(got, ref, strict=True)
    )
    med = {k: statistics.median(v) for k, v in rates.items()}
    print(
        f"{a.inputs} inputs x ~{a.tokens} tokens ({n_tokens} tokens), medians of {a.rounds} rounds: "
        f"SparseEncoder {med['SparseEncoder']:.0f} tok/s, embedserve {med['embedserve']:.0f} tok/s "
        f"({med['embedserve'] / med['SparseEncoder']:.2f}x); same terms: {same_terms}; "
        f"max |diff| {np.abs(got - ref).max():.2e}"
    )


if __name__ == "__main__":
    main()
