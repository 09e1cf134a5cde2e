"""SPLADE sparse vectors: the engine against sentence-transformers' SparseEncoder on one directory,
alternating in one process (tok/s, medians over rounds), with the largest value difference and
whether the non-zero terms agree.

    python benchmarks/sparse_bench.py DIR [--tokens 512] [--inputs 32] [--rounds 3] [--batch 8]

DIR: a SparseEncoder directory (tests/helpers/tiny_sparse.py `build_splade` makes one from
all-MiniLM-L6-v2's real encoder and a seeded head). `--build N`: build it there first (if
absent) with N positions (MiniLM's 512 tiled; N = 8192 for an 8K-token run).

    python benchmarks/sparse_bench.py /tmp/splade-8k --build 8192 --tokens 8192 --inputs 4
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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dir")
    p.add_argument("--tokens", type=int, default=512)
    p.add_argument("--inputs", type=int, default=32)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--batch", type=int, default=8, help="SparseEncoder's batch size")
    p.add_argument("--build", type=int, default=None, metavar="POSITIONS", help="build DIR first")
    a = p.parse_args()
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
        n_tokens = sum(len(t.token_ids) for t in engine.tokenize(items))
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
