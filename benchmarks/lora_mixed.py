"""Multi-LoRA serving cost, side by side in one run: the same inputs through (1) the base engine
without LoRA, (2) the LoRA engine on base rows only, (3) the LoRA engine with the inputs spread
over N adapters (every step mixes their rows), (4) one adapter merged into the weights
(--merge-lora). Each runs in a process of its own, as a server does (engines sharing a process
slowed each other's small matmuls); rounds alternate them (this box drifts); tokens/s medians and
each engine's ratio to (1), paired by round. Also: the adapters' memory against N merged copies
of the model, and every adapter's vectors against PEFT's (transformers + peft, fp32).

    python benchmarks/lora_mixed.py --model DIR [--adapters 8] [--rank 16] [--inputs 64]
        [--tokens 256] [--rounds 3] [--repeat 2] [--budget 2048] [--dtype float32]

DIR: a Hugging Face / sentence-transformers directory of a decoder (e.g. SmolLM2-135M from
benchmarks/smollm2_dir.py) or a BERT-family encoder (all-MiniLM-L6-v2). The adapters are random
(rank `--rank`, every linear layer PEFT can target there), written under --work.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from embedserve import Engine
from embedserve.engine.adapters import view
from embedserve.engine.ask import Ask

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


_KINDS = ("base", "lora-base-rows", "lora-mixed", "merged")


def engine_options(args: argparse.Namespace, kind: str, modules: tuple[str, ...]) -> dict[str, Any]:
    options: dict[str, Any] = {"dtype": args.dtype, "max_num_batched_tokens": args.budget}
    if kind.startswith("lora"):
        options |= {"lora_modules": modules, "max_loras": len(modules)}
    elif kind == "merged":
        options |= {"lora_modules": modules[:1], "merge_lora": True}
    return options


def inputs(args: argparse.Namespace, engine: Engine) -> list[list[int]]:
    vocab = min(engine.config.model.vocab_size, 30000)
    gen = np.random.default_rng(0)
    return [[int(x) for x in gen.integers(1000, vocab, args.tokens)] for _ in range(args.inputs)]


def run_one(args: argparse.Namespace, kind: str, modules: tuple[str, ...]) -> list[float]:
    """One engine of `kind` in this process: a warm-up, then `--repeat` timed runs of every
    input submitted alone, in order, all queued before the last runs (input i on adapter
    i % N when mixed): every kind queues the same way, so only the model's work differs."""
    with Engine.from_pretrained(args.model, **engine_options(args, kind, modules)) as engine:
        engines = [engine]
        if kind == "lora-mixed":
            assert engine.adapters is not None
            engines = [view(engine, a) for a in engine.adapters.all()]
        seqs = inputs(args, engine)
        prepared = [engines[i % len(engines)].prepare([s], Ask(prompt="")) for i, s in enumerate(seqs)]

        def once() -> float:
            start = time.perf_counter()
            futures = [
                f for i, s in enumerate(seqs) for f in engines[i % len(engines)].submit(prepared[i])
            ]
            for f in futures:
                f.result()
            return time.perf_counter() - start

        once()
        return [once() for _ in range(args.repeat)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, required=True)
    p.add_argument("--adapters", type=int, default=8)
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--inputs", type=int, default=64)
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--repeat", type=int, default=2, help="timed runs per process (its best counts)")
    p.add_argument("--budget", type=int, default=2048)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "embedserve-lora-bench")
    p.add_argument("--only", choices=_KINDS, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.only is not None:  # a child: one engine, its times on stdout
        modules = tuple(f"a{i}={args.work / f'a{i}'}" for i in range(args.adapters))
        print(json.dumps(run_one(args, args.only, modules)))
        return
    paths = make_adapters(args.model, args.work, args.adapters, args.rank)
    modules = tuple(f"a{i}={path}" for i, path in enumerate(paths))
    names = {
        "base": "base engine (no LoRA)",
        "lora-base-rows": "LoRA engine, base rows",
        "lora-mixed": f"LoRA engine, {len(paths)} adapters mixed",
        "merged": "one adapter merged (--merge-lora)",
    }
    times: dict[str, list[float]] = {names[k]: [] for k in _KINDS}
    for _ in range(args.rounds):  # each round: every kind in a fresh process, one after another
        for kind in _KINDS:
            child = [sys.executable, __file__, *sys.argv[1:], "--only", kind]
            out = subprocess.run(child, check=True, capture_output=True, text=True).stdout
            times[names[kind]].append(min(json.loads(out.strip().splitlines()[-1])))
    tokens = args.inputs * args.tokens
    first = next(iter(times))
    print(
        f"{args.model.name}, {args.dtype}, {args.inputs} inputs x {args.tokens} tokens, "
        f"budget {args.budget}, {len(paths)} adapters of rank {args.rank}, "
        f"{torch.get_num_threads()} threads, {args.rounds} rounds of a process per engine"
    )
    print("| engine | tokens/s (median) | x base engine (paired by round) |\n|---|---|---|")
    for name, ts in times.items():
        ratio = statistics.median(b / t for b, t in zip(times[first], ts, strict=True))
        print(f"| {name} | {tokens / statistics.median(ts):,.0f} | {ratio:.3f} |")
    report_memory_and_parity(args, paths, modules)


def report_memory_and_parity(args: argparse.Namespace, paths: list[Path], modules: tuple[str, ...]) -> None:
    with Engine.from_pretrained(args.model, **engine_options(args, "lora-mixed", modules)) as lora:
        assert lora.adapters is not None
        model = lora._loop.parts.core.runner.model
        weights = sum(p.numel() * p.element_size() for p in model.parameters())
        adapters = sum(a.nbytes for a in lora.adapters.all())
        print(
            f"\nmemory: {len(paths)} adapters {adapters / 2**20:.1f} MiB in float32; "
            f"{len(paths)} merged copies of the model {len(paths) * weights / 2**20:.1f} MiB "
            f"({len(paths) * weights / adapters:.0f}x)"
        )
        pooling = lora.config.pooling.method.value
        check = inputs(args, lora)[:4]
        worst = []
        for a, path in zip(lora.adapters.all(), paths, strict=True):
            got = view(lora, a).embed(check, prompt="")
            want = peft_vectors(args.model, path, check, pooling)
            worst.append(float(np.min(np.sum(got * want, axis=1) / np.linalg.norm(got, axis=1))))
    with Engine.from_pretrained(args.model, **engine_options(args, "merged", modules)) as merged:
        got = merged.embed(check, prompt="")
        merged_min = float(np.min(np.sum(got * peft_vectors(args.model, paths[0], check, pooling), axis=1)))
    print(
        f"parity vs PEFT (fp32, {len(check)} inputs each): min cosine per adapter {min(worst):.6f} "
        f"(all: {', '.join(f'{w:.6f}' for w in worst)}); merged {merged_min:.6f}"
    )


if __name__ == "__main__":
    main()
