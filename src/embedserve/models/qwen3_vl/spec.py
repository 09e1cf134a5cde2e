"""What a Qwen3-VL directory says beyond the text decoder: the vision tower's numbers, M-RoPE
sections, the vision special tokens and the image preprocessing (`preprocessor_config.json`)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from embedserve.errors import ModelLoadError
from embedserve.vision.image import ImageConfig
from embedserve.vision.template import read_chat_template

ARCHITECTURES = ("Qwen3VLForConditionalGeneration", "Qwen3VLModel")
DEFAULT_INSTRUCTION = "Represent the user's input."


@dataclass(frozen=True)
class VisionSpec:
    depth: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    in_channels: int
    patch_size: int
    temporal_patch_size: int
    spatial_merge_size: int
    out_hidden_size: int
    num_position_embeddings: int
    deepstack_visual_indexes: tuple[int, ...]
    hidden_act: str
    rope_theta: float


@dataclass(frozen=True)
class Qwen3VLSpec:
    vision: VisionSpec
    mrope_section: tuple[int, int, int]
    image_token_id: int
    vision_start_token_id: int
    vision_end_token_id: int
    image: ImageConfig
    chat_template: str | None = None  # the directory's, if any (vision/template.py)

    @property
    def num_deepstack(self) -> int:
        return len(self.vision.deepstack_visual_indexes)


def read_spec(raw: dict[str, Any], root: Path) -> Qwen3VLSpec:
    v = raw.get("vision_config")
    if not v:
        raise ModelLoadError("a Qwen3-VL config.json needs a vision_config")
    text = raw["text_config"]
    rope = text.get("rope_parameters") or text.get("rope_scaling") or {}
    section = tuple(int(x) for x in rope.get("mrope_section", (24, 20, 20)))
    if len(section) != 3:
        raise ModelLoadError(f"mrope_section must have 3 entries (t, h, w), got {list(section)}")
    if rope.get("mrope_interleaved", True) is not True:
        raise ModelLoadError("only interleaved M-RoPE (Qwen3-VL's) is implemented")
    heads = int(v["num_heads"])
    head_dim = int(v["hidden_size"]) // heads
    if head_dim % 4:
        raise ModelLoadError(f"vision head_dim {head_dim} must be a multiple of 4 (2-D rotary)")
    act = str(v.get("hidden_act", "gelu_pytorch_tanh"))
    if act not in ("gelu_pytorch_tanh", "gelu"):
        raise ModelLoadError(f"unsupported vision activation {act!r}")
    vrope = v.get("rope_parameters") or {}
    vision = VisionSpec(
        depth=int(v["depth"]),
        hidden_size=int(v["hidden_size"]),
        intermediate_size=int(v["intermediate_size"]),
        num_heads=heads,
        in_channels=int(v.get("in_channels", 3)),
        patch_size=int(v["patch_size"]),
        temporal_patch_size=int(v.get("temporal_patch_size", 2)),
        spatial_merge_size=int(v.get("spatial_merge_size", 2)),
        out_hidden_size=int(v["out_hidden_size"]),
        num_position_embeddings=int(v["num_position_embeddings"]),
        deepstack_visual_indexes=tuple(int(i) for i in v.get("deepstack_visual_indexes", ())),
        hidden_act=act,
        rope_theta=float(vrope.get("rope_theta", 10000.0)),
    )
    pre = root / "preprocessor_config.json"
    image = ImageConfig()
    if pre.exists():
        try:
            image = ImageConfig.from_json(json.loads(pre.read_text(encoding="utf-8")))
        except (OSError, ValueError) as e:
            raise ModelLoadError(f"cannot read {pre}: {e}") from e
    if (image.patch_size, image.merge_size, image.temporal_patch_size) != (
        vision.patch_size,
        vision.spatial_merge_size,
        vision.temporal_patch_size,
    ):
        raise ModelLoadError("preprocessor_config.json's patch / merge sizes disagree with vision_config")
    return Qwen3VLSpec(
        vision=vision,
        mrope_section=(section[0], section[1], section[2]),
        image_token_id=int(raw.get("image_token_id", 151655)),
        vision_start_token_id=int(raw.get("vision_start_token_id", 151652)),
        vision_end_token_id=int(raw.get("vision_end_token_id", 151653)),
        image=image,
        chat_template=read_chat_template(root),
    )
