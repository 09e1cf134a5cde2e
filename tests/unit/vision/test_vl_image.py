"""Image preprocessing pinned to transformers' Qwen2-VL / Qwen3-VL image processor (PIL
backend): grid sizes and pixel values; decoding PNG / JPEG / WebP and refusing bad images."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from embedserve.errors import InvalidInputError
from embedserve.vision.image import ImageConfig, ImageTooLargeError, decode_image, image_tokens, preprocess
from tests.helpers.tiny_vl import encoded, image

SIZES = [(224, 224), (1, 40), (33, 1000), (640, 480), (1500, 1000), (17, 19), (100, 3)]


def _hf_processor(cfg: ImageConfig):  # type: ignore[no-untyped-def]
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    return Qwen2VLImageProcessorPil(
        size={"shortest_edge": cfg.min_pixels, "longest_edge": cfg.max_pixels},
        patch_size=cfg.patch_size,
        merge_size=cfg.merge_size,
        temporal_patch_size=cfg.temporal_patch_size,
        image_mean=list(cfg.image_mean),
        image_std=list(cfg.image_std),
    )


@pytest.mark.parametrize(
    "cfg",
    [ImageConfig(), ImageConfig(min_pixels=4 * 32 * 32, max_pixels=64 * 32 * 32)],
    ids=["qwen3-vl-defaults", "tiny-limits"],
)
def test_grids_and_pixels_match_transformers(cfg: ImageConfig) -> None:
    hf = _hf_processor(cfg)
    for i, (w, h) in enumerate(SIZES):
        img = image(w, h, seed=i)
        ours = preprocess(img, cfg)
        ref = hf(images=[img], return_tensors="np")
        assert list(ours.grid) == ref["image_grid_thw"][0].tolist(), (w, h)
        assert ours.num_tokens == image_tokens(w, h, cfg)  # counted from the size alone
        assert ours.pixels.shape == ref["pixel_values"].shape
        np.testing.assert_allclose(ours.pixels, ref["pixel_values"], atol=1e-5, rtol=0)


def test_rgba_and_grayscale_become_rgb_like_transformers() -> None:
    cfg = ImageConfig(min_pixels=4 * 32 * 32, max_pixels=64 * 32 * 32)
    hf = _hf_processor(cfg)
    for mode in ("RGBA", "L"):
        img = image(90, 70, seed=3).convert(mode)
        np.testing.assert_allclose(
            preprocess(img, cfg).pixels, hf(images=[img], return_tensors="np")["pixel_values"], atol=1e-5
        )


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP"])
def test_decodes_supported_formats(fmt: str) -> None:
    img = image(64, 48, seed=1)
    out = decode_image(encoded(img, fmt))
    assert out.size == (64, 48) and out.mode == "RGB"
    if fmt == "PNG":  # lossless
        assert np.array_equal(np.asarray(out), np.asarray(img))


def test_refuses_bad_images() -> None:
    with pytest.raises(InvalidInputError, match="cannot be decoded"):
        decode_image(b"\x89PNG\r\n\x1a\n not really a png")
    with pytest.raises(InvalidInputError, match="cannot be decoded"):
        decode_image(encoded(image(32, 32, seed=0), "GIF"))  # a real image, unsupported format
    truncated = encoded(image(256, 256, seed=0), "PNG")[:200]
    with pytest.raises(InvalidInputError, match="cannot be decoded"):
        decode_image(truncated)
    with pytest.raises(ImageTooLargeError, match="exceeds the limit"):
        decode_image(encoded(image(200, 100, seed=0)), max_pixels=199 * 100)


def test_decompression_bomb_refused_from_the_header() -> None:
    """A 20000 x 20000 PNG of one colour is a few hundred KB; it is refused before decoding."""
    bomb = encoded(Image.new("L", (20_000, 20_000)), "PNG")
    assert len(bomb) < 2_000_000
    with pytest.raises(ImageTooLargeError):
        decode_image(bomb, max_pixels=50_000_000)


def test_extreme_aspect_ratio_refused() -> None:
    with pytest.raises(InvalidInputError, match="aspect ratio"):
        preprocess(Image.new("RGB", (1000, 2)), ImageConfig())
