"""Parity of the configurations benchmarks/q06.sh measures: engine fp32 and bf16 (default
options: 8K+ inputs go layer-major) vs Hugging Face transformers fp32 on the same inputs.

    PYTHONPATH=. .venv/bin/python benchmarks/q06_parity.py /tmp/embedserve-bench-models/q06
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from embedserve import Engine
from tests.helpers.reference import cosine, hf_embed_ids, random_ids

LENGTHS = (512, 4096, 8192)


def main() -> None:
    path = Path(sys.argv[1])
    seqs = [random_ids(n, seed=n) for n in LENGTHS]
    t = time.perf_counter()
    ref = hf_embed_ids(path, seqs)
    print(f"reference: transformers fp32, {time.perf_counter() - t:.0f} s")
    print("| engine | " + " | ".join(f"cosine at {n}" for n in LENGTHS) + " |")
    print("|---|" + "---|" * len(LENGTHS))
    for dtype in ("float32", "bfloat16"):
        with Engine.from_pretrained(path, dtype=dtype, max_model_len=16384) as engine:
            got = engine.embed(seqs)
            lane = engine.stats().get("layer_major_finished", 0)
        cells = " | ".join(f"{c:.6f}" for c in cosine(got, ref))
        print(f"| {dtype} ({lane} layer-major) | {cells} |")


if __name__ == "__main__":
    main()
