"""What a multimodal (Qwen3-VL) model changes in rendering: its prompter and its inputs (the
options it runs without are refused by engine/resolve.py)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from embedserve.errors import InputTooLongError, InvalidInputError, ModelLoadError
from embedserve.models.qwen3_vl.spec import DEFAULT_INSTRUCTION
from embedserve.models.source import ModelSource
from embedserve.tokenizer.core import Tokenized, Tokenizer, Truncate, tokenize_inputs
from embedserve.vision.image import DEFAULT_MAX_IMAGE_PIXELS
from embedserve.vision.prompt import (
    DEFAULT_MAX_IMAGES,
    MultimodalPrompter,
    PromptLimits,
    as_parts,
    has_image,
    is_image,
)

__all__ = [
    "MultimodalPrompter",
    "multimodal_prompter",
    "text_items",
    "tokenize_multimodal",
]


def multimodal_prompter(
    files: ModelSource, max_pixels: int | None, max_images: int | None
) -> MultimodalPrompter:
    spec = files.multimodal
    assert spec is not None
    limits = PromptLimits(
        max_image_pixels=DEFAULT_MAX_IMAGE_PIXELS if max_pixels is None else max_pixels,
        max_images=DEFAULT_MAX_IMAGES if max_images is None else max_images,
    )
    if limits.max_image_pixels < 1 or limits.max_images < 1:
        raise ModelLoadError("max_image_pixels and max_images_per_input must be >= 1")
    try:
        tok = files.tokenizer()
        return MultimodalPrompter(tok, spec.image, DEFAULT_INSTRUCTION, limits, spec.chat_template)
    except ValueError as e:
        raise ModelLoadError(str(e)) from None


def tokenize_multimodal(
    prompter: MultimodalPrompter, tokenizer: Tokenizer, items: Sequence[Any], instruction: str, limit: int
) -> list[Tokenized]:
    """Each item (a string, an image, or a list of them) in the model's chat format, with its
    images preprocessed and M-RoPE positions computed; raises naming the first bad item.
    A token-id list is taken as the final sequence (text only: no vision tokens in it)."""
    if len(items) == 0:
        raise InvalidInputError("inputs is empty: pass at least one string, image or list of parts")
    out = []
    for i, item in enumerate(items):
        try:
            if isinstance(item, list) and item and all(isinstance(t, int) for t in item):
                out.append(_text_ids(prompter, tokenizer, item, limit))
                continue
            ids, state = prompter.encode(as_parts(item), instruction, limit)
        except InputTooLongError as e:
            raise InputTooLongError(e.num_tokens, e.limit, index=i) from None
        except InvalidInputError as e:
            raise type(e)(f"input {i}: {e}") from None
        out.append(Tokenized(token_ids=ids, truncated=False, multimodal=state if state.spans else None))
    return out


def tokenize_items(
    prompter: MultimodalPrompter | None,
    tokenizer: Tokenizer,
    inputs: Any,
    prompt: str,
    limit: int,
    truncate: str,
    model: str,
) -> list[Tokenized]:
    """`Engine.tokenize`: a string, an image or a list of them (or of token-id lists), with the
    chat format's instruction `prompt` where the model reads images, else the text prompt."""
    policy = Truncate.parse(truncate)
    items: Sequence[Any] = [inputs] if isinstance(inputs, str) or is_image(inputs) else inputs
    if prompter is not None:  # the chat format; `prompt` is the instruction
        return tokenize_multimodal(prompter, tokenizer, items, prompt, limit)
    return tokenize_inputs(tokenizer, text_items(items, model), prompt, limit, policy)


def text_items(items: Sequence[Any], model: str) -> list[Any]:
    """A text-only model's items: a list of text parts is their concatenation; an image part
    is refused naming the model."""
    out = []
    for i, item in enumerate(items):
        if isinstance(item, str) or (isinstance(item, list) and item and isinstance(item[0], int)):
            out.append(item)  # text, token ids: as they are (no walk over a long id list)
            continue
        if has_image(item):
            raise InvalidInputError(f"input {i}: model {model} takes text only; it cannot embed image parts")
        is_parts = isinstance(item, (list, tuple)) and bool(item) and all(isinstance(p, str) for p in item)
        out.append("".join(item) if is_parts else item)
    return out


def _text_ids(prompter: MultimodalPrompter, tokenizer: Tokenizer, ids: list[int], limit: int) -> Tokenized:
    if prompter.image_token_id in ids:
        raise InvalidInputError("token-id inputs cannot hold image tokens; send the image as a part")
    return tokenizer.check_ids(ids, limit, Truncate.ERROR)
