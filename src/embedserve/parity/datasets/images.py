"""`images`: synthetic text + image inputs for multimodal models, drawn offline and deterministic.

Each image is drawn with PIL (a gradient background, a few filled shapes, a word of text) at one
of `sizes` (default 64x64, 128x96, 200x150, 96x224, 320x240), and has a caption saying what it
shows. The corpus cycles through four kinds of item: the caption alone (text only), the image
alone, caption + image, and text and two images interleaved (`caption, image, text, image`).
Corpus only: no queries (cosine per vector is the check). Same seed and Pillow, same images.
Options: `count` (items, default 16), `seed`, `sizes` (`WxH,WxH,...`).
"""

from __future__ import annotations

import io
import random

from PIL import Image, ImageDraw

from embedserve.parity.datasets.base import Dataset, DatasetContext, Item, Parts
from embedserve.parity.options import Options, ParityError

DEFAULT_SIZES = "64x64,128x96,200x150,96x224,320x240"
KINDS = ("text", "image", "caption+image", "interleaved")
COLOURS = {
    "red": (220, 40, 40),
    "green": (40, 170, 60),
    "blue": (40, 70, 210),
    "yellow": (235, 210, 40),
    "black": (15, 15, 15),
    "white": (245, 245, 245),
    "purple": (130, 50, 160),
}
SHAPES = ("circle", "square", "triangle", "bar")
WORDS = ("sales", "north", "draft", "total", "page 3", "fig. 2", "Q4", "map")


def parse_sizes(text: str) -> list[tuple[int, int]]:
    """`WxH,WxH` -> [(W, H), ...]; each side 1 .. 4096."""
    out = []
    for piece in text.split(","):
        w, sep, h = piece.strip().lower().partition("x")
        if not (sep and w.isdigit() and h.isdigit()) or not (0 < int(w) <= 4096 and 0 < int(h) <= 4096):
            raise ParityError(f"image size {piece.strip()!r}: expected WxH with sides 1..4096 (e.g. 448x448)")
        out.append((int(w), int(h)))
    return out


def draw_image(width: int, height: int, rng: random.Random) -> tuple[Image.Image, str]:
    """A gradient, 1-3 shapes and a word; the caption names what was drawn."""
    names = list(COLOURS)
    top, bottom = rng.sample(names, 2)
    img = Image.new("RGB", (width, height))
    draw = ImageDraw.Draw(img)
    a, b = COLOURS[top], COLOURS[bottom]
    for y in range(height):
        t = y / max(height - 1, 1)
        draw.line([(0, y), (width, y)], fill=tuple(round(a[i] + (b[i] - a[i]) * t) for i in range(3)))
    drawn = []
    for _ in range(rng.randint(1, 3)):
        shape, colour = rng.choice(SHAPES), rng.choice(names)
        x0, y0 = rng.randrange(0, max(width // 2, 1)), rng.randrange(0, max(height // 2, 1))
        x1, y1 = (
            x0 + rng.randint(width // 6 + 1, width // 2 + 1),
            y0 + rng.randint(height // 6 + 1, height // 2 + 1),
        )
        fill = COLOURS[colour]
        if shape == "circle":
            draw.ellipse([x0, y0, x1, y1], fill=fill)
        elif shape == "square":
            draw.rectangle([x0, y0, x1, y1], fill=fill)
        elif shape == "triangle":
            draw.polygon([(x0, y1), ((x0 + x1) // 2, y0), (x1, y1)], fill=fill)
        else:
            draw.rectangle([x0, y0, x0 + max((x1 - x0) // 4, 1), y1], fill=fill)
        drawn.append(f"a {colour} {shape}")
    word = rng.choice(WORDS)
    draw.text((2, 2), word, fill=COLOURS[rng.choice(names)])
    caption = f"{', '.join(drawn)} on a {top} to {bottom} gradient, labelled '{word}'"
    return img, caption


def png(img: Image.Image) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def load_images(ctx: DatasetContext, opts: Options) -> Dataset:
    count = opts.integer("count", 16)
    seed = opts.integer("seed", 0)
    sizes = parse_sizes(opts.text("sizes", DEFAULT_SIZES) or DEFAULT_SIZES)
    opts.finish()
    assert count is not None and seed is not None
    if count < 1:
        raise ParityError("images: count must be >= 1")
    if ctx.image_tokens is None:
        raise ParityError(
            "dataset images needs a multimodal model (e.g. Qwen3-VL): neither backend's model directory "
            "has a preprocessor_config.json"
        )
    rng = random.Random(seed)
    corpus: dict[str, Item] = {}
    for i in range(count):
        kind = KINDS[i % len(KINDS)]
        w, h = sizes[i % len(sizes)]
        img, caption = draw_image(w, h, rng)
        if kind == "text":
            parts: tuple[str | bytes, ...] = (caption,)
        elif kind == "image":
            parts = (png(img),)
        elif kind == "caption+image":
            parts = (f"{caption}: ", png(img))
        else:
            w2, h2 = sizes[(i + 1) % len(sizes)]
            img2, caption2 = draw_image(w2, h2, rng)
            parts = (f"{caption}: ", png(img), f" and next, {caption2}: ", png(img2))
        corpus[f"{kind}-{i}"] = Parts(parts)
    info = {"seed": seed, "sizes": [f"{w}x{h}" for w, h in sizes], "kinds": list(KINDS)}
    return Dataset("images", corpus, {}, {}, info)
