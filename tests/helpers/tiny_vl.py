"""Tiny random-weight Qwen3-VL models (Qwen3VLConfig + save_pretrained) with the real Qwen
tokenizer and a preprocessor_config.json, and the transformers reference on the same directory.

Text: hidden 64, 3 layers, head_dim 64 (M-RoPE sections 12/10/10), DeepStack after layers 0
and 1; vision: depth 2, hidden 64, patch 16, merge 2, an 8 x 8 learned position table.
Weights are drawn large (as tests/helpers/tiny_models.py) so a wrong position or a DeepStack row
at the wrong offset moves the vector far below the parity bar (test_vl_sensitivity.py).
"""

from __future__ import annotations

import io
import json
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from embedserve.embedders.vl import VLReference
from tests.helpers.tiny_models import scale_weights, write_qwen_tokenizer

IMAGE_TOKEN_ID = 151655
INSTRUCTION = "Represent the user's input."
PREPROCESSOR = {
    "image_processor_type": "Qwen2VLImageProcessor",
    "processor_class": "Qwen3VLProcessor",
    "patch_size": 16,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "do_rescale": True,
    "rescale_factor": 1 / 255,
    "do_normalize": True,
    "do_resize": True,
    "do_convert_rgb": True,
    "resample": 3,
    # 4 .. 64 image tokens (32 x 32 pixels each)
    "size": {"shortest_edge": 4 * 32 * 32, "longest_edge": 64 * 32 * 32},
}


def build_vl(dst: Path, *, std: float = 0.25, seed: int = 0, layout: str = "model") -> Path:
    """`layout`: "model" saves Qwen3VLModel (no `model.` prefix), "generation" saves
    Qwen3VLForConditionalGeneration (`model.language_model.*`, `model.visual.*`, lm_head)."""
    import transformers

    dst.mkdir(parents=True, exist_ok=True)
    config = transformers.Qwen3VLConfig(
        text_config={
            "vocab_size": 151669,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 3,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 64,
            "max_position_embeddings": 32768,
            "rms_norm_eps": 1e-6,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 5_000_000.0,
                "mrope_section": [12, 10, 10],
                "mrope_interleaved": True,
            },
        },
        vision_config={
            "depth": 2,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_heads": 2,
            "patch_size": 16,
            "temporal_patch_size": 2,
            "spatial_merge_size": 2,
            "out_hidden_size": 64,
            "num_position_embeddings": 64,
            "deepstack_visual_indexes": [0, 1],
        },
        tie_word_embeddings=False,
    )
    cls = transformers.Qwen3VLModel if layout == "model" else transformers.Qwen3VLForConditionalGeneration
    config.architectures = [cls.__name__]
    torch.manual_seed(seed)
    model = cls(config)
    scale_weights(model, std, seed)
    model.save_pretrained(dst, safe_serialization=True)
    write_qwen_tokenizer(dst, append_eos=False)
    (dst / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR))
    return dst


def image(width: int, height: int, seed: int) -> Image.Image:
    """A random-pixel RGB image (smooth enough that resizing matters, random enough to differ)."""
    gen = np.random.default_rng(seed)
    small = gen.integers(0, 256, size=(max(height // 8, 1), max(width // 8, 1), 3), dtype=np.uint8)
    return Image.fromarray(small).resize((width, height), Image.Resampling.BILINEAR)


def encoded(img: Image.Image, fmt: str = "PNG") -> bytes:
    buf = io.BytesIO()
    img.save(buf, format=fmt)
    return buf.getvalue()


# ---- the reference: transformers on the same directory --------------------------------------


@lru_cache(maxsize=4)
def _hf(path: str) -> VLReference:
    return VLReference(Path(path))


def reference_prompt(parts: list[str | Image.Image], instruction: str = INSTRUCTION) -> str:
    """The official embedder's chat format, one <|image_pad|> per image (expanded later)."""
    body = "".join(p if isinstance(p, str) else "<|vision_start|><|image_pad|><|vision_end|>" for p in parts)
    return (
        f"<|im_start|>system\n{instruction}<|im_end|>\n<|im_start|>user\n{body}<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def hf_vl_embed(
    path: Path, parts: list[str | Image.Image], instruction: str = INSTRUCTION, text: str | None = None
) -> np.ndarray:
    """transformers' Qwen3VLModel, fp32: post-final-norm last token, L2-normalized. `text`: the
    prompt already rendered (one <|image_pad|> per image), else the official embedder's format."""
    text = reference_prompt(parts, instruction) if text is None else text
    return _hf(str(path)).embed(parts, instruction, text)
