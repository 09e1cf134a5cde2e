"""Qwen3-VL on the CPU, engine vs transformers side by side in one run (random weights).

Builds a mid-size random-weight Qwen3-VL directory (or takes --model), then on the same inputs:
- the vision tower alone: images/s (the same preprocessed pixels on both sides);
- a text + image mix end to end: tokens/s (engine: `Engine.embed` on all inputs, preprocessing
  included; transformers: processor + Qwen3VLModel per input), and the cosine of each vector;
- with --cases: per-case cosine to the fp32 reference on the tiny test model, fp32 and bf16.

    PYTHONPATH=src python benchmarks/vl_bench.py [--images 8 --image-size 448x448]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from embedserve import Engine
from embedserve.vision.image import ImageConfig, preprocess
from tests.helpers.reference import cosine
from tests.helpers.tiny_vl import _hf, hf_vl_embed, image


def build_mid(dst: Path) -> Path:
    import json

    import transformers

    from tests.helpers.tiny_models import scale_weights, write_qwen_tokenizer
    from tests.helpers.tiny_vl import PREPROCESSOR

    cfg = transformers.Qwen3VLConfig(
        text_config={
            "vocab_size": 151669,
            "hidden_size": 512,
            "intermediate_size": 1536,
            "num_hidden_layers": 6,
            "num_attention_heads": 8,
            "num_key_value_heads": 4,
            "head_dim": 64,
            "max_position_embeddings": 32768,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 5e6,
                "mrope_section": [12, 10, 10],
                "mrope_interleaved": True,
            },
        },
        vision_config={
            "depth": 6,
            "hidden_size": 384,
            "intermediate_size": 1536,
            "num_heads": 6,
            "patch_size": 16,
            "temporal_patch_size": 2,
            "spatial_merge_size": 2,
            "out_hidden_size": 512,
            "num_position_embeddings": 2304,
            "deepstack_visual_indexes": [1, 3, 5],
        },
    )
    cfg.architectures = ["Qwen3VLModel"]
    model = transformers.Qwen3VLModel(cfg)
    scale_weights(model, 0.05, 0)
    model.save_pretrained(dst)
    write_qwen_tokenizer(dst, append_eos=False)
    pre = dict(PREPROCESSOR, size={"shortest_edge": 65536, "longest_edge": 16777216})
    (dst / "preprocessor_config.json").write_text(json.dumps(pre))
    return dst


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--images", type=int, default=8)
    ap.add_argument("--image-size", default="448x448")
    ap.add_argument("--text-words", type=int, default=200)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--build-only", action="store_true")
    args = ap.parse_args()
    w, h = (int(x) for x in args.image_size.split("x"))
    path = args.model or build_mid(Path(tempfile.mkdtemp()) / "qwen3_vl_mid")
    if args.build_only:
        print(path)
        return
    imgs = [image(w, h, seed=i) for i in range(args.images)]
    inputs = [
        [f"document {i}: " + "lorem ipsum " * (args.text_words // 2), img] for i, img in enumerate(imgs)
    ]
    torch.set_num_threads(torch.get_num_threads())
    hf, _, proc = _hf(str(path))
    with Engine.from_pretrained(path, dtype=args.dtype, max_num_batched_tokens=2048) as engine:
        tower = engine._loop.core.runner.model.visual
        cfg = ImageConfig.from_json(__import__("json").loads((path / "preprocessor_config.json").read_text()))
        pre = [preprocess(img, cfg) for img in imgs]
        pixels = torch.from_numpy(np.concatenate([p.pixels for p in pre]))
        grids = [p.grid for p in pre]
        with torch.inference_mode():
            tower(pixels, grids)  # warm
            t = time.perf_counter()
            tower(pixels, grids)
            ours_tower = time.perf_counter() - t
            thw = torch.tensor(grids)
            hf.visual(pixels, grid_thw=thw)
            t = time.perf_counter()
            hf.visual(pixels, grid_thw=thw)
            hf_tower = time.perf_counter() - t
        engine.embed(inputs[:1])
        t = time.perf_counter()
        outs = engine.run(inputs)
        ours_e2e = time.perf_counter() - t
    tokens = sum(o.num_tokens for o in outs)
    hf_embed_one = hf_vl_embed
    hf_vl_embed(path, inputs[0])
    t = time.perf_counter()
    ref = np.stack([hf_embed_one(path, p) for p in inputs])
    hf_e2e = time.perf_counter() - t
    cos = cosine(np.stack([o.embedding for o in outs]), ref)
    del proc
    print(
        f"model {path.name}, {args.images} inputs of {args.image_size} + ~{args.text_words} words, "
        f"{tokens} tokens ({pre[0].num_tokens} per image), {torch.get_num_threads()} threads, {args.dtype}"
    )
    print(
        f"vision tower: engine {args.images / ours_tower:.2f} images/s, "
        f"transformers {args.images / hf_tower:.2f}"
    )
    print(f"text+image:   engine {tokens / ours_e2e:.0f} tok/s, transformers {tokens / hf_e2e:.0f} tok/s")
    print(f"cosine to transformers fp32: min {cos.min():.6f}, p50 {np.median(cos):.6f}")


if __name__ == "__main__":
    main()
