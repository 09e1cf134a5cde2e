"""BGE-M3's lexical weights at its real shape (XLM-R large: 24 layers, hidden 1024, vocabulary
250,002, 8,194 positions; random weights and a random `sparse_linear.pt`): the engine vs
transformers' forward + FlagEmbedding's formula, each arm in a fresh process (its peak RSS is
its own), the same token ids, the same vectors checked.

    python benchmarks/lexical_bench.py --dir /tmp/bge-m3-shape --tokens 8192 --inputs 1
    python benchmarks/lexical_bench.py --dir /tmp/bge-m3-shape --tokens 512 --inputs 16

The directory is built on first use (about 2.3 GB of float32 safetensors).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

VOCAB = 250_002


def build(dst: Path) -> None:
    if (dst / "sparse_linear.pt").exists():
        return
    import torch
    import transformers

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.helpers.tiny_bert import TOKENIZER_FILES, minilm_dir
    from tests.helpers.tiny_models import write_st_files

    config = transformers.XLMRobertaConfig(
        vocab_size=VOCAB, hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
        intermediate_size=4096, max_position_embeddings=8194, type_vocab_size=1, pad_token_id=1,
    )  # fmt: skip
    torch.manual_seed(0)
    transformers.XLMRobertaModel(config, add_pooling_layer=False).save_pretrained(
        dst, safe_serialization=True
    )
    for name in TOKENIZER_FILES:  # a tokenizer for loading; the inputs are token ids
        (dst / name).write_bytes((minilm_dir() / name).read_bytes())
    write_st_files(dst, 1024, "cls", True, {}, 8192)
    linear = torch.nn.Linear(1024, 1)
    torch.save(linear.state_dict(), dst / "sparse_linear.pt")


def inputs(tokens: int, n: int) -> list[list[int]]:
    rng = np.random.default_rng(0)
    return [
        [101, *rng.integers(1000, 30_000, size=tokens - 2).tolist(), 102] for _ in range(n)
    ]  # [CLS] .. [SEP]


def run_arm(arm: str, path: Path, tokens: int, n: int, out: Path) -> None:
    import torch

    seqs = inputs(tokens, n)
    if arm == "engine":
        from embedserve import Engine
        from embedserve.engine.ask import Ask
        from embedserve.pooling.outputs import Output

        with Engine.from_pretrained(path, max_model_len=8192, max_num_batched_tokens=8192) as engine:
            engine.run([[101, 1005, 1006, 102]], Ask(Output.LEXICAL))  # warm-up
            loaded_mb = _rss_mb()
            start = time.perf_counter()
            rows = np.stack([o.embedding for o in engine.run(seqs, Ask(Output.LEXICAL))])
            took = time.perf_counter() - start
    else:
        from transformers import AutoModel

        model = AutoModel.from_pretrained(path, attn_implementation="sdpa").eval()
        from tokenizers import Tokenizer

        from embedserve.models.lexical_head import unused_ids

        state = torch.load(path / "sparse_linear.pt", weights_only=True)
        unused = torch.tensor(sorted(unused_ids(path, Tokenizer.from_file(str(path / "tokenizer.json")))))
        loaded_mb = _rss_mb()
        start = time.perf_counter()
        out_rows = []
        with torch.inference_mode():
            for seq in seqs:
                hidden = model(input_ids=torch.tensor([seq])).last_hidden_state[0]
                weights = torch.relu(hidden @ state["weight"][0] + state["bias"][0])
                vec = torch.zeros(VOCAB)
                ids = torch.tensor(seq)
                keep = ~torch.isin(ids, unused)  # FlagEmbedding's unused tokens: cls, eos, pad, unk
                vec.scatter_reduce_(0, ids[keep], weights[keep], reduce="amax", include_self=True)
                out_rows.append(vec.numpy())
        took = time.perf_counter() - start
        rows = np.stack(out_rows)
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    np.save(out.with_suffix(".npy"), rows)
    result = {
        "arm": arm,
        "seconds": took,
        "tok_s": tokens * n / took,
        "peak_mb": peak_mb,
        "loaded_mb": loaded_mb,
    }
    out.write_text(json.dumps(result))


def _rss_mb() -> float:
    """Resident now (weights a memory-mapped file left untouched on disk do not count)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", type=Path, default=Path("/tmp/bge-m3-shape"))
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--inputs", type=int, default=1)
    ap.add_argument("--arm", choices=["engine", "hf"], default=None, help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.arm is not None:
        run_arm(args.arm, args.dir, args.tokens, args.inputs, args.out)
        return
    build(args.dir)
    results = {}
    for arm in ("engine", "hf"):
        out = Path(f"/tmp/lexical_bench_{arm}.json")
        cmd = [sys.executable, __file__, "--dir", str(args.dir), "--tokens", str(args.tokens),
               "--inputs", str(args.inputs), "--arm", arm, "--out", str(out)]  # fmt: skip
        subprocess.run(cmd, check=True)
        results[arm] = json.loads(out.read_text())
    a, b = np.load("/tmp/lexical_bench_engine.npy"), np.load("/tmp/lexical_bench_hf.npy")
    same = all(np.array_equal(np.flatnonzero(x), np.flatnonzero(y)) for x, y in zip(a, b, strict=True))
    print(f"BGE-M3 shape (random weights), {args.inputs} x {args.tokens} tokens; fresh process per arm")
    print("| arm | seconds | tok/s | RSS after load MB | peak RSS MB | peak - after load |")
    print("|---|---|---|---|---|---|")
    for arm, r in results.items():
        grew = r["peak_mb"] - r["loaded_mb"]
        rss = f"{r['loaded_mb']:,.0f} | {r['peak_mb']:,.0f} | {grew:,.0f}"
        print(f"| {arm} | {r['seconds']:.1f} | {r['tok_s']:,.0f} | {rss} |")
    print(f"engine / transformers tok/s: {results['engine']['tok_s'] / results['hf']['tok_s']:.2f}x; "
          f"same non-zero ids: {same}; largest difference {np.abs(a - b).max():.2e}")  # fmt: skip


if __name__ == "__main__":
    main()
