"""The image mix (`--images-per-input N --image-size WxH`): each input is text + N synthetic images.

An input is then a list of `/v1/embeddings` content parts (text first, then the images as PNG
data URIs: JSON, so it travels to the workers like a text); http targets send it as a content
item, the engine target as parts. A request's length stays its total in tokens: the text is
made shorter by the images' tokens, each image counting its tokens in the model's
`preprocessor_config.json` (from its size, as the gateway counts) plus its two vision
start / end tokens. The chat format's few instruction tokens are not counted (nor are they
for text inputs through a multimodal model). Images are PIL drawings (gradients, shapes, a
word), deterministic per seed, workload and request, and differ between requests.
"""

from __future__ import annotations

import base64
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from embedserve.bench.target import BenchInput
from embedserve.errors import InvalidInputError
from embedserve.parity.datasets.images import draw_image, png
from embedserve.vision.image import ImageConfig, image_tokens

VISION_MARKERS = 2  # <|vision_start|> and <|vision_end|> around each image's tokens


@dataclass(frozen=True)
class ImageMix:
    per_input: int
    width: int
    height: int
    tokens_each: int  # image tokens + vision markers of one image

    @property
    def tokens(self) -> int:
        """Tokens the images of one input take."""
        return self.per_input * self.tokens_each

    def describe(self) -> str:
        return f"{self.per_input} x {self.width}x{self.height} image(s), {self.tokens_each} tokens each"


def parse_image_size(text: str) -> tuple[int, int]:
    w, sep, h = text.strip().lower().partition("x")
    if not (sep and w.isdigit() and h.isdigit()) or not (0 < int(w) <= 8192 and 0 < int(h) <= 8192):
        raise InvalidInputError(f"--image-size must be WxH with sides 1..8192 (e.g. 448x448), got {text!r}")
    return int(w), int(h)


def image_mix(model_dir: Path, per_input: int, size: tuple[int, int]) -> ImageMix:
    """The mix for this model: its preprocessor decides each image's tokens."""
    pre = model_dir / "preprocessor_config.json"
    if not pre.is_file():
        raise InvalidInputError(
            f"--images-per-input needs a multimodal model (Qwen3-VL): {model_dir} has no "
            "preprocessor_config.json to count image tokens with"
        )
    cfg = ImageConfig.from_json(json.loads(pre.read_text(encoding="utf-8")))
    width, height = size
    return ImageMix(per_input, width, height, image_tokens(width, height, cfg) + VISION_MARKERS)


def data_uri(image_png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(image_png).decode("ascii")


def with_images(texts: list[str], mix: ImageMix, key: str, seed: int) -> list[BenchInput]:
    """Each text followed by its own `mix.per_input` images, as content parts."""
    out: list[BenchInput] = []
    for i, text in enumerate(texts):
        parts: list[dict[str, Any]] = [{"type": "text", "text": text}]
        for j in range(mix.per_input):
            img, _ = draw_image(mix.width, mix.height, random.Random(f"{seed}/{key}/{i}/{j}"))
            parts.append({"type": "image_url", "image_url": {"url": data_uri(png(img))}})
        out.append(parts)
    return out


def engine_parts(item: BenchInput) -> Any:
    """An input as `Engine.embed` takes it: a text, or text parts and image bytes in order."""
    if isinstance(item, str):
        return item
    out: list[str | bytes] = []
    for part in item:
        if part["type"] == "text":
            out.append(part["text"])
        else:
            url = part["image_url"]["url"]
            out.append(base64.b64decode(url.split(",", 1)[1]))
    return out


def http_item(item: BenchInput) -> Any:
    """An input as `/v1/embeddings` takes it: a text, or a content item."""
    return item if isinstance(item, str) else {"content": item}
