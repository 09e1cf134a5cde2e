"""Image decoding and Qwen-VL preprocessing on the CPU with PIL + numpy (no torchvision).

    PIL image --RGB--> smart resize (multiples of patch * merge, pixel count in [min, max],
    bicubic) --> x / 255 --> (x - mean) / std --> patches [grid_h * grid_w, C * T * P * P]

Patches are laid out in merge-block order (all patches of one merge x merge block together),
each one C x T x P x P with the frame repeated T times: exactly what transformers'
Qwen2-VL image processor produces (pinned in tests/unit/vision/test_vl_image.py).
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from PIL import Image

from embedserve.errors import ImageTooLargeError, InvalidInputError

FORMATS = ("PNG", "JPEG", "WEBP")  # what a data URI or bytes part may hold
DEFAULT_MAX_IMAGE_PIXELS = 64_000_000  # decoded size limit (decompression bombs)

__all__ = ["ImageTooLargeError"]  # raised here, defined with the other errors


@dataclass(frozen=True)
class ImageConfig:
    """`preprocessor_config.json` of a Qwen-VL model (defaults: Qwen3-VL's)."""

    patch_size: int = 16
    temporal_patch_size: int = 2
    merge_size: int = 2
    min_pixels: int = 65536
    max_pixels: int = 16777216
    image_mean: tuple[float, float, float] = (0.5, 0.5, 0.5)
    image_std: tuple[float, float, float] = (0.5, 0.5, 0.5)
    rescale_factor: float = 1 / 255

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> ImageConfig:
        size = raw.get("size") or {}
        base = cls()
        return cls(
            patch_size=int(raw.get("patch_size", base.patch_size)),
            temporal_patch_size=int(raw.get("temporal_patch_size", base.temporal_patch_size)),
            merge_size=int(raw.get("merge_size", base.merge_size)),
            min_pixels=int(raw.get("min_pixels") or size.get("shortest_edge") or base.min_pixels),
            max_pixels=int(raw.get("max_pixels") or size.get("longest_edge") or base.max_pixels),
            image_mean=tuple(float(x) for x in raw.get("image_mean", base.image_mean)),  # type: ignore[arg-type]
            image_std=tuple(float(x) for x in raw.get("image_std", base.image_std)),  # type: ignore[arg-type]
            rescale_factor=float(raw.get("rescale_factor", base.rescale_factor)),
        )

    @property
    def factor(self) -> int:
        return self.patch_size * self.merge_size


@dataclass(frozen=True)
class ProcessedImage:
    pixels: np.ndarray  # float32 [grid_h * grid_w, C * T * P * P], merge-block order
    grid: tuple[int, int, int]  # (t, h, w) in patches
    merge: int  # spatial merge size: one prompt token per merge x merge patches

    @property
    def num_tokens(self) -> int:
        """Tokens the image occupies in the prompt."""
        t, h, w = self.grid
        return t * h * w // self.merge**2


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """(height, width) rounded to multiples of `factor`, pixel count in [min, max], aspect kept."""
    if min(height, width) < 1:
        raise InvalidInputError(f"image of size {width}x{height} is empty")
    if max(height, width) / min(height, width) > 200:
        raise InvalidInputError(f"image aspect ratio {width}x{height} exceeds 200:1")
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def grid_for(width: int, height: int, cfg: ImageConfig) -> tuple[int, int, int]:
    """The patch grid (1, h, w) of an image of this size, without touching its pixels (token
    counting from the size alone)."""
    h, w = smart_resize(height, width, cfg.factor, cfg.min_pixels, cfg.max_pixels)
    return 1, h // cfg.patch_size, w // cfg.patch_size


def image_tokens(width: int, height: int, cfg: ImageConfig) -> int:
    t, h, w = grid_for(width, height, cfg)
    return t * h * w // cfg.merge_size**2


def preprocess(image: Image.Image, cfg: ImageConfig) -> ProcessedImage:
    rgb = image if image.mode == "RGB" else image.convert("RGB")
    _, gh, gw = grid_for(rgb.width, rgb.height, cfg)
    p, m, t = cfg.patch_size, cfg.merge_size, cfg.temporal_patch_size
    resized = rgb.resize((gw * p, gh * p), resample=Image.Resampling.BICUBIC)
    x = np.asarray(resized, dtype=np.float32).transpose(2, 0, 1)  # [C, H, W]
    x = (x.astype(np.float64) * cfg.rescale_factor).astype(np.float32)
    mean = np.asarray(cfg.image_mean, dtype=np.float32)[:, None, None]
    std = np.asarray(cfg.image_std, dtype=np.float32)[:, None, None]
    x = (x - mean) / std
    c = x.shape[0]
    # [C, gh/m, m, P, gw/m, m, P] -> [gh/m, gw/m, m, m, C, P, P]: merge blocks, then patches
    blocks = x.reshape(c, gh // m, m, p, gw // m, m, p).transpose(1, 4, 2, 5, 0, 3, 6)
    frames = np.broadcast_to(blocks[:, :, :, :, :, None], (*blocks.shape[:5], t, p, p))
    pixels = np.ascontiguousarray(frames.reshape(gh * gw, c * t * p * p), dtype=np.float32)
    return ProcessedImage(pixels, (1, gh, gw), m)


def decode_image(data: bytes, max_pixels: int = DEFAULT_MAX_IMAGE_PIXELS) -> Image.Image:
    """PNG / JPEG / WebP bytes -> a loaded RGB image; anything else, a corrupt file or one
    larger than `max_pixels` (checked from the header, before decoding) raises."""
    try:
        img = Image.open(io.BytesIO(data), formats=list(FORMATS))
    except Image.DecompressionBombError:
        raise ImageTooLargeError(f"image exceeds the pixel limit ({max_pixels})") from None
    except Exception:
        raise InvalidInputError(f"image cannot be decoded: not a valid {', '.join(FORMATS)} file") from None
    if img.width * img.height > max_pixels:
        raise ImageTooLargeError(
            f"image of {img.width}x{img.height} pixels exceeds the limit of {max_pixels} pixels"
        )
    try:
        img.load()
        return img.convert("RGB")
    except Exception as e:
        raise InvalidInputError(f"image cannot be decoded: {type(e).__name__}") from None
