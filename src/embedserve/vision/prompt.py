"""Multimodal inputs -> token ids + image state, in Qwen3-VL-Embedding's chat format.

The directory's chat template renders the prompt when it has one (vision/template.py); else the
built-in format of the official embedder: the instruction in a system message, the input's parts
in order in a user message, then the generation prompt; the vector is the last token's:

    <|im_start|>system\\n{instruction}<|im_end|>\\n<|im_start|>user\\n
    {text}<|vision_start|><|image_pad|> x n<|vision_end|>{text} ...<|im_end|>\\n
    <|im_start|>assistant\\n

n is the image's token count (its patch grid / merge^2). A plain string is the one-part input,
so a text through the multimodal path is the same prompt and gives the same vector.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from PIL import Image
from tokenizers import Tokenizer as HFTokenizer

from embedserve.errors import InputTooLongError, InvalidInputError
from embedserve.vision.image import (
    DEFAULT_MAX_IMAGE_PIXELS,
    ImageConfig,
    ImageTooLargeError,
    ProcessedImage,
    decode_image,
    image_tokens,
    preprocess,
)
from embedserve.vision.state import ImageSpan, MultimodalState
from embedserve.vision.template import ChatTemplate

VISION_START, IMAGE_PAD, VISION_END = "<|vision_start|>", "<|image_pad|>", "<|vision_end|>"
DEFAULT_MAX_IMAGES = 16


@dataclass(frozen=True)
class ImagePart:
    """An image part: encoded bytes (PNG, JPEG, WebP) or a PIL image."""

    image: bytes | Image.Image


Part = str | bytes | Image.Image | ImagePart


def is_image(part: Any) -> bool:
    return isinstance(part, (bytes, bytearray, Image.Image, ImagePart))


def has_image(item: Any) -> bool:
    """Whether an input item (one part or a list of parts) holds an image."""
    if is_image(item):
        return True
    return isinstance(item, (list, tuple)) and any(is_image(p) for p in item)


def as_parts(item: Any) -> list[Part]:
    """One input item -> its ordered parts (a string or an image alone is a one-part input)."""
    if isinstance(item, str) or is_image(item):
        return [item]
    if isinstance(item, (list, tuple)) and item and all(isinstance(p, str) or is_image(p) for p in item):
        return list(item)
    raise InvalidInputError(
        "expected a string, an image (PIL image or PNG / JPEG / WebP bytes) or a non-empty list of them"
    )


@dataclass(frozen=True)
class PromptLimits:
    max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS  # decoded pixels per image (413 above)
    max_images: int = DEFAULT_MAX_IMAGES  # images per input


class MultimodalPrompter:
    def __init__(
        self,
        tokenizer: HFTokenizer,
        image: ImageConfig,
        default_instruction: str,
        limits: PromptLimits | None = None,
        chat_template: str | None = None,
    ) -> None:
        self.tok = tokenizer
        self.image = image
        self.default_instruction = default_instruction
        self.limits = limits or PromptLimits()
        self.template = None if chat_template is None else ChatTemplate(chat_template)
        pad = tokenizer.token_to_id(IMAGE_PAD)
        if (
            pad is None
            or tokenizer.token_to_id(VISION_START) is None
            or tokenizer.token_to_id(VISION_END) is None
        ):
            raise InvalidInputError(
                f"the tokenizer lacks the vision tokens {VISION_START} {IMAGE_PAD} {VISION_END}"
            )
        self.image_token_id = pad

    def images(self, parts: Sequence[Part]) -> list[ProcessedImage]:
        raw = [p for p in parts if is_image(p)]
        if len(raw) > self.limits.max_images:
            raise InvalidInputError(
                f"{len(raw)} images in one input exceed the limit of {self.limits.max_images}"
            )
        out = []
        for p in raw:
            img = p.image if isinstance(p, ImagePart) else p
            if isinstance(img, (bytes, bytearray)):
                img = decode_image(bytes(img), self.limits.max_image_pixels)
            elif not isinstance(img, Image.Image):
                raise InvalidInputError(f"expected image bytes or a PIL image, got {type(img).__name__}")
            elif img.width * img.height > self.limits.max_image_pixels:
                raise ImageTooLargeError(
                    f"image of {img.width}x{img.height} pixels exceeds the limit of "
                    f"{self.limits.max_image_pixels} pixels"
                )
            out.append(preprocess(img, self.image))
        return out

    def text(self, parts: Sequence[object], image_tokens: list[int], instruction: str) -> str:
        """The prompt text: strings as they are, every other part the next image's tokens; in
        the directory's chat template when it has one, else in the built-in format."""
        for p in parts:
            if isinstance(p, str) and any(t in p for t in (VISION_START, IMAGE_PAD, VISION_END)):
                raise InvalidInputError("text parts may not contain vision special tokens")
        instruction = instruction or self.default_instruction
        if self.template is not None:
            return self._templated(parts, image_tokens, instruction)
        content = []
        k = 0
        for p in parts:
            if isinstance(p, str):
                content.append(p)
            else:
                content.append(VISION_START + IMAGE_PAD * image_tokens[k] + VISION_END)
                k += 1
        return (
            f"<|im_start|>system\n{instruction}<|im_end|>\n"
            f"<|im_start|>user\n{''.join(content)}<|im_end|>\n<|im_start|>assistant\n"
        )

    def _templated(self, parts: Sequence[object], image_tokens: list[int], instruction: str) -> str:
        assert self.template is not None
        content = [{"type": "text", "text": p} if isinstance(p, str) else {"type": "image"} for p in parts]
        pieces = self.template.render(instruction, content).split(IMAGE_PAD)
        if len(pieces) != len(image_tokens) + 1:
            raise InvalidInputError(
                f"the model's chat template wrote {len(pieces) - 1} image placeholders "
                f"for {len(image_tokens)} images"
            )
        out = [pieces[0]]
        for n, piece in zip(image_tokens, pieces[1:], strict=True):
            out += [IMAGE_PAD * n, piece]
        return "".join(out)

    def count(self, parts: Sequence[str | tuple[int, int]], instruction: str) -> int:
        """Tokens of an input whose images are given by their (width, height) only: what
        `encode` will count, without decoding or preprocessing a pixel (the gateway)."""
        sizes = [p for p in parts if not isinstance(p, str)]
        if len(sizes) > self.limits.max_images:
            raise InvalidInputError(
                f"{len(sizes)} images in one input exceed the limit of {self.limits.max_images}"
            )
        counts = [image_tokens(w, h, self.image) for w, h in sizes]
        return len(self.tok.encode(self.text(parts, counts, instruction), add_special_tokens=True).ids)

    def encode(
        self, parts: Sequence[Part], instruction: str, max_len: int
    ) -> tuple[list[int], MultimodalState]:
        """Token ids (image tokens included) and the image state with its M-RoPE positions."""
        images = self.images(parts)
        text = self.text(parts, [img.num_tokens for img in images], instruction)
        ids = list(self.tok.encode(text, add_special_tokens=True).ids)
        if len(ids) > max_len:
            raise InputTooLongError(len(ids), max_len)
        spans = []
        i = 0
        for img in images:
            while ids[i] != self.image_token_id:
                i += 1
            spans.append(ImageSpan(i, img))
            i += img.num_tokens
        if sum(1 for t in ids if t == self.image_token_id) != sum(s.image.num_tokens for s in spans):
            raise InvalidInputError("image tokens in the prompt do not match its images")
        return ids, MultimodalState.of(len(ids), spans)
