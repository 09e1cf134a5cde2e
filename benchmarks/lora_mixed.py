"""Multi-LoRA serving cost, side by side in one process: the same inputs through
(1) the base engine without LoRA, (2) the LoRA engine on base rows only, (3) the LoRA engine with
the inputs spread over N adapters (every step mixes their rows), (4) one adapter merged into the
weights (--merge-lora). Rounds alternate the engines (this box drifts); tokens/s medians and each
engine's ratio to (1), paired by round. Also: the adapters' memory against N merged copies of the
model, and every adapter's vectors against PEFT's (transformers + peft, float32) on a few inputs.

    python benchmarks/lora_mixed.py --model DIR [--adapters 8] [--rank 16] [--inputs 64]
        [--tokens 256] [--rounds 3] [--budget 2048] [--dtype float32]

DIR: a Hugging Face / sentence-transformers directory of a decoder (e.g. SmolLM2-135M from
benchmarks/smollm2_dir.py) or a BERT-family encoder (all-MiniLM-L6-v2). The adapters are random
(rank `--rank`, every linear layer PEFT can target there), written under --work.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from embedserve import Engine
from embedserve.engine.adapters import view

_DECODER = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
_ENCODER = ["query", "key", "value", "dense", "attn.q", "attn.k", "attn.v", "attn.o"]


def make_adapters(base: Path, out: Path, n: int, rank: int) -> list[Path]:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModel

    causal = json.loads((base / "config.json").read_text()).get("model_type") in (
        "llama",
        "qwen2",
        "qwen3",
        "mistral",
    )
    names = {n for n, _ in AutoModel.from_pretrained(base).named_modules()}
    targets = [t for t in (_DECODER if causal else _ENCODER) if any(m.endswith(t) for m in names)]
    paths = []
    for i in range(n):
        torch.manual_seed(i)
        model = get_peft_model(
            AutoModel.from_pretrained(base), LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=targets)
        )
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "lora_" in name:
                    p.normal_(0, 0.3 / rank**0.5)
        model.save_pretrained(out / f"a{i}")
        paths.append(out / f"a{i}")
    return paths


def peft_vectors(base: Path, adapter: Path, seqs: list[list[int]], pooling: str) -> np.ndarray:
    from peft import PeftModel
    from transformers import AutoModel

    model: Any = PeftModel.from_pretrained(AutoModel.from_pretrained(base).eval(), adapter).eval()
    out = []
    with torch.inference_mode():
        for ids in seqs:
            h = model(input_ids=torch.tensor([ids])).last_hidden_state[0]
            v = h[-1] if pooling == "lasttoken" else h.mean(0) if pooling == "mean" else h[0]
            out.append(torch.nn.functional.normalize(v, dim=-1).numpy())
    return np.stack(out)


def timed(run: Any) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, required=True)
    p.add_argument("--adapters", type=int, default=8)
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--inputs", type=int, default=64)
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--budget", type=int, default=2048)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "embedserve-lora-bench")
    args = p.parse_args()
    paths = make_adapters(args.model, args.work, args.adapters, args.rank)
    common = {"dtype": args.dtype, "max_num_batched_tokens": args.budget}
    modules = tuple(f"a{i}={path}" for i, path in enumerate(paths))
    base = Engine.from_pretrained(args.model, **common)
    lora = Engine.from_pretrained(args.model, lora_modules=modules, max_loras=len(paths), **common)
    merged = Engine.from_pretrained(args.model, lora_modules=(modules[0],), merge_lora=True, **common)
    assert lora.adapters is not None
    views = [view(lora, a) for a in lora.adapters.all()]
    vocab = min(lora.config.model.vocab_size, 30000)
    gen = np.random.default_rng(0)
    seqs = [[int(x) for x in gen.integers(1000, vocab, args.tokens)] for _ in range(args.inputs)]

    def one_by_one(engines: list[Engine]) -> None:
        """Each input submitted alone, in order (input i on engines[i % len]), all queued before
        the last runs: every run queues the same way, so only the model's work differs."""
        futures = [f for i, s in enumerate(seqs) for f in engines[i % len(engines)].submit([s], prompt="")[0]]
        for f in futures:
            f.result()

    runs = {
        "base engine (no LoRA)": lambda: one_by_one([base]),
        "LoRA engine, base rows": lambda: one_by_one([lora]),
        f"LoRA engine, {len(views)} adapters mixed": lambda: one_by_one(views),
        "one adapter merged (--merge-lora)": lambda: one_by_one([merged]),
    }
    for run in runs.values():  # warm-up
        run()
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(args.rounds):
        for name, run in runs.items():
            time.sleep(1)  # the last engine's OpenMP threads stop spinning first
            times[name].append(timed(run))
    tokens = args.inputs * args.tokens
    first = next(iter(times))
    print(
        f"{args.model.name}, {args.dtype}, {args.inputs} inputs x {args.tokens} tokens, "
        f"budget {args.budget}, {len(views)} adapters of rank {args.rank}, "
        f"{torch.get_num_threads()} threads, {args.rounds} rounds"
    )
    print("| engine | tokens/s (median) | x base engine (paired by round) |\n|---|---|---|")
    for name, ts in times.items():
        ratio = statistics.median(b / t for b, t in zip(times[first], ts, strict=True))
        print(f"| {name} | {tokens / statistics.median(ts):,.0f} | {ratio:.3f} |")
    weights = sum(p.numel() * p.element_size() for p in base._loop.parts.core.runner.model.parameters())
    adapters = sum(a.nbytes for a in lora.adapters.all())
    print(
        f"\nmemory: {len(views)} adapters {adapters / 2**20:.1f} MiB in float32; "
        f"{len(views)} merged copies of the model {len(views) * weights / 2**20:.1f} MiB "
        f"({len(views) * weights / adapters:.0f}x)"
    )
    pooling = lora.config.pooling.method.value
    check = seqs[:4]
    worst = []
    for v, path in zip(views, paths, strict=True):
        got = v.embed(check, prompt="")
        want = peft_vectors(args.model, path, check, pooling)
        worst.append(float(np.min(np.sum(got * want, axis=1) / np.linalg.norm(got, axis=1))))
    merged_got = merged.embed(check, prompt="")
    merged_min = float(
        np.min(np.sum(merged_got * peft_vectors(args.model, paths[0], check, pooling), axis=1))
    )
    print(
        f"parity vs PEFT (fp32, {len(check)} inputs each): min cosine per adapter {min(worst):.6f} "
        f"(all: {', '.join(f'{w:.6f}' for w in worst)}); merged {merged_min:.6f}"
    )
    for e in (base, lora, merged):
        e.close()


if __name__ == "__main__":
    main()
