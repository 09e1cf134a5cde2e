"""A/B two source trees of embedserve on every output kind: are the answers bit-identical?

A refactor of how outputs are declared, routed or assembled must not move one bit of any
answer. This builds small random-weight models of every kind (the test fixtures: no network),
then runs each tree in a fresh process over the same inputs, in fp32 and bf16:

    dense (a decoder, a BERT encoder, a GGUF file), sparse (SPLADE and inference-free SPLADE's
    queries), BGE-M3's dense + lexical + token vectors (one pass and each alone), ColBERT's
    query and document token vectors, late chunks (spans and long windows), rerank (a
    cross-encoder and a yes / no reranker) and classify (three labels)

and compares every array byte for byte (bf16 runs keep bf16 weights on any CPU:
EMBEDSERVE_CPU_BF16=1).

    git worktree add /tmp/before <rev>
    python benchmarks/ab_outputs.py --a /tmp/before/src --b src [--dtypes float32,bfloat16]

Exit status 1 if any answer differs (the report names it), else 0.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

# Runs inside each tree's process, with the tree's `src` first on sys.path.
_CHILD = r"""
import json, sys
import numpy as np
from embedserve import Engine

models, dtype, texts, out_file = json.loads(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3]), sys.argv[4]
long_doc = " ".join(texts)
out = {}

def run(name, options=None):
    return Engine.from_pretrained(models[name], dtype=dtype, **(options or {}))

if hasattr(Engine, "prepare"):  # one path: an Ask per output (engine/ask.py)
    import asyncio
    from embedserve.engine.ask import Ask, LateChunking, Prepared
    from embedserve.pooling.outputs import Output

    def embed_late(e, doc, **late):
        return e.run(doc, Ask(Output.SPANS, late=LateChunking(**late)))[0].embeddings
    def embed_lexical(e, texts):
        return np.stack([o.embedding for o in e.run(texts, Ask(Output.LEXICAL))])
    def embed_multivector(e, texts, input_type="document", truncate="error"):
        ask = Ask(Output.MULTIVECTOR, side=input_type, truncate=truncate)
        return [o.embedding for o in e.run(texts, ask)]
    def one_pass(e, texts, dimensions):
        ask = Ask(dimensions=dimensions, extras=frozenset({Output.LEXICAL, Output.MULTIVECTOR}))
        done = asyncio.run(e.run_async(Prepared(ask, e.renderer.text(texts))))
        return [p.dense for p in done], [p.lexical for p in done], [p.multivector for p in done]
else:  # a method per output
    import asyncio

    def embed_late(e, doc, **late):
        return e.embed_late(doc, **late).embeddings
    def embed_lexical(e, texts):
        return e.embed_lexical(texts)
    def embed_multivector(e, texts, input_type="document", truncate="error"):
        return e.embed_multivector(texts, input_type=input_type, truncate=truncate)
    def one_pass(e, texts, dimensions):
        coro = e.embed_dense_and_lexical_async(e.tokenize(texts), dimensions=dimensions, multivector=True)
        one = asyncio.run(coro)
        return list(one.dense), list(one.sparse), list(one.multivector)

for name in ("decoder", "encoder", "gguf"):
    with run(name) as e:
        out[f"{name}.dense"] = e.embed(texts)
        out[f"{name}.late_spans"] = embed_late(e, texts[0], chunk_size=16)
with run("decoder", {"max_model_len": 128}) as e:  # a document over the limit, as windows
    out["decoder.late_long"] = embed_late(e, long_doc, chunk_size=32, long=True, overlap=32)
with run("splade") as e:
    out["splade.sparse"] = e.embed(texts)
with run("inference_free") as e:
    out["inference_free.documents"] = e.embed(texts)
    out["inference_free.queries"] = e.embed(texts, prompt_name="query")
with run("bge_m3") as e:
    out["bge_m3.dense"] = e.embed(texts)
    out["bge_m3.lexical"] = embed_lexical(e, texts)
    for i, v in enumerate(embed_multivector(e, texts)):
        out[f"bge_m3.tokens.{i}"] = v
    for i, parts in enumerate(zip(*one_pass(e, texts, 16))):
        for part, v in zip(("dense", "lexical", "tokens"), parts):
            out[f"bge_m3.one_pass.{part}.{i}"] = v
with run("colbert") as e:
    for side in ("query", "document"):
        for i, v in enumerate(embed_multivector(e, texts, input_type=side, truncate="end")):
            out[f"colbert.{side}.{i}"] = v
with run("cross_encoder", {"task": "rerank"}) as e:
    out["cross_encoder.rerank"] = np.array([r.relevance_score for r in e.rerank(texts[0], texts[1:])])
with run("yes_no", {"task": "rerank"}) as e:
    out["yes_no.rerank"] = np.array([r.relevance_score for r in e.rerank(texts[0], texts[1:])])
with run("classifier") as e:
    out["classifier.probs"] = np.array([r.probs for r in e.classify(texts)])
np.savez(out_file, **{k: np.asarray(v) for k, v in out.items()})
"""


def build_models(root: Path) -> dict[str, str]:
    """The test suite's tiny random-weight models, one of each kind."""
    from tests.helpers.tiny_bert import build_encoder
    from tests.helpers.tiny_gguf import build_gguf_pair, train_tokenizer
    from tests.helpers.tiny_models import build_decoder
    from tests.helpers.tiny_multivector import build_colbert
    from tests.helpers.tiny_rerankers import build_cross_encoder, build_qwen3_reranker
    from tests.helpers.tiny_sparse import build_bge_m3, build_inference_free, build_splade

    splade = build_splade(root / "splade")
    models = {
        "decoder": build_decoder(root / "decoder"),
        "encoder": build_encoder(root / "encoder"),
        "gguf": build_gguf_pair(root / "gguf", "llama", train_tokenizer())[1],
        "splade": splade,
        "inference_free": build_inference_free(root / "free", splade),
        "bge_m3": build_bge_m3(root / "bge_m3"),
        "colbert": build_colbert(root / "colbert"),
        "cross_encoder": build_cross_encoder(root / "cross_encoder"),
        "yes_no": build_qwen3_reranker(root / "qwen3-reranker"),
        "classifier": build_cross_encoder(root / "classifier", labels=["a", "b", "c"]),
    }
    return {k: str(v) for k, v in models.items()}


def run_tree(
    src: Path, models: dict[str, str], dtype: str, texts: list[str], out: Path
) -> dict[str, np.ndarray]:
    env = {**os.environ, "PYTHONPATH": str(src.resolve())}
    if dtype == "bfloat16":  # bf16 weights and activations even on a CPU without bf16 dot products
        env["EMBEDSERVE_CPU_BF16"] = "1"
    cmd = [sys.executable, "-c", _CHILD, json.dumps(models), dtype, json.dumps(texts), str(out)]
    done = subprocess.run(cmd, env=env, cwd=tempfile.gettempdir(), capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"tree {src} failed ({dtype}):\n{done.stderr[-3000:]}")
    with np.load(out) as f:
        return {k: f[k] for k in f.files}


def compare(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> list[str]:
    """What differs: a missing answer, another shape, or any byte."""
    problems = [f"{k}: only in {'A' if k in a else 'B'}" for k in sorted(set(a) ^ set(b))]
    for k in sorted(set(a) & set(b)):
        if a[k].shape != b[k].shape:
            problems.append(f"{k}: shape {a[k].shape} vs {b[k].shape}")
        elif a[k].tobytes() != b[k].tobytes():
            diff = float(np.max(np.abs(a[k].astype(np.float64) - b[k].astype(np.float64))))
            problems.append(f"{k}: values differ (max |a - b| {diff:.3g})")
    return problems


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--a", type=Path, required=True, help="tree A's src directory")
    ap.add_argument("--b", type=Path, required=True, help="tree B's src directory")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--work", type=Path, default=None, help="where models are built (default: a temp dir)")
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the test suite's fixtures
    from tests.helpers.real_text import documents

    texts = [d[:200] for d in documents()[:6]]
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work or Path(tmp)
        models = build_models(work / "models")
        failed = False
        for dtype in args.dtypes.split(","):
            a = run_tree(args.a, models, dtype, texts, Path(tmp) / f"a-{dtype}.npz")
            b = run_tree(args.b, models, dtype, texts, Path(tmp) / f"b-{dtype}.npz")
            problems = compare(a, b)
            kinds = sorted({k.split(".")[0] + "." + k.split(".")[1] for k in a})
            status = "bit-identical" if not problems else f"{len(problems)} differ"
            print(f"{dtype}: {len(a)} arrays over {len(kinds)} outputs, {status}")
            print("  outputs: " + ", ".join(kinds))
            for p in problems:
                print("  " + p)
            failed |= bool(problems)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
