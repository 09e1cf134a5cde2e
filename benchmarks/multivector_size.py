"""How large a multi-vector answer is: one document of `--tokens` tokens through `POST
/v1/embeddings` (`embedding_type: multivector`) on an in-process server, in each encoding
(JSON floats, base64, and the compressed types' own bytes), with the time each answer took (median of
`--rounds`).

The model is a decoder ColBERT directory (tests/helpers/tiny_multivector.py `decoder_colbert`):
`--base` (default: the tests' tiny Qwen3 with the real Qwen3 tokenizer) with a seeded
Dense(hidden -> `--dim`) head. The size depends only on the vectors and their width.

    python benchmarks/multivector_size.py --tokens 8192 --dim 128
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ENCODINGS = [
    ("float", "float"),
    ("float", "base64"),
    ("int8", "float"),
    ("int8", "base64_bytes"),
    ("binary", "base64_bytes"),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--base", type=Path, default=None, help="a decoder directory (default: the tiny Qwen3)")
    ap.add_argument("--dir", type=Path, default=Path("/tmp/embedserve-bench-mv"), help="where to build")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the test fixtures' builders
    from tests.helpers.inprocess import server_client
    from tests.helpers.real_text import long_text
    from tests.helpers.tiny_models import build_decoder
    from tests.helpers.tiny_multivector import decoder_colbert

    base = args.base or build_decoder(args.dir / "qwen3", "qwen3")
    model = decoder_colbert(base, args.dir / f"colbert-{base.name}-{args.dim}", dim=args.dim)
    with server_client(model, max_output_vectors=args.tokens + 64) as client:
        text = long_text(args.tokens * 6)
        ids = client.post("/tokenize", json={"prompt": text}).json()["tokens"][: args.tokens - 2]
        document = client.post("/detokenize", json={"tokens": ids}).json()["prompt"]
        print(f"model {model} (dim {args.dim}); one document; {args.rounds} rounds, medians")
        print("| multivector_dtype | encoding_format | vectors | response bytes | bytes / vector | ms |")
        print("|---|---|---|---|---|---|")
        for dtype, encoding in ENCODINGS:
            body = {"input": document, "embedding_type": "multivector", "encoding_format": encoding}
            if dtype != "float":
                body["multivector_dtype"] = dtype
            times, size, n = [], 0, 0
            for _ in range(args.rounds):
                start = time.perf_counter()
                resp = client.post("/v1/embeddings", json=body)
                times.append(time.perf_counter() - start)
                resp.raise_for_status()
                size, n = len(resp.content), resp.json()["data"][0]["shape"][0]
            ms = statistics.median(times) * 1000
            print(f"| {dtype} | {encoding} | {n} | {size:,} | {size / n:.0f} | {ms:.0f} |")


if __name__ == "__main__":
    main()
