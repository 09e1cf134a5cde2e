"""Multimodal input items of `/v1/embeddings`, and vLLM's chat-embedding body (`messages`).

    "input": ["text",                                                       one text
              {"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}},  one image
              {"content": [{"type": "text", "text": "..."}, {"type": "image_url", ...}]}]  parts
    "messages": [{"role": "system", "content": "instruction"},
                 {"role": "user", "content": [parts as above]}]     one input (vLLM's body)

Parsing keeps image URLs as `ImageURL`; `resolve` turns them into bytes while tokenizing (off
the event loop): only `data:` URIs of PNG / JPEG / WebP, a remote URL is refused (400), the
server never fetches. Shape errors are 422 (validation); content errors 400, images over the
pixel limit 413 (engine).
"""

from __future__ import annotations

import base64
import binascii
import io
import re
from dataclasses import dataclass
from typing import Any

from embedserve.errors import InvalidInputError
from embedserve.vision.image import FORMATS
from embedserve.vision.prompt import ImagePart

_DATA_URI = re.compile(r"data:(?P<mime>[\w/+.-]+)?(?P<params>(;[\w=.+-]+)*),(?P<data>.*)", re.DOTALL)
MIME_TYPES = ("image/png", "image/jpeg", "image/jpg", "image/webp")


@dataclass(frozen=True)
class ImageURL:
    url: str


Part = str | ImageURL
Item = str | list[Part]


def is_multimodal_item(value: object) -> bool:
    return isinstance(value, dict)


def parse_item(value: dict[str, Any]) -> list[Part]:
    """One dict item: an image part, a text part, or `{"content": [parts]}`."""
    if "content" in value:
        if set(value) - {"content", "role"}:
            raise ValueError(f"unknown keys {sorted(set(value) - {'content', 'role'})} in a content item")
        return parse_content(value["content"])
    return [parse_part(value)]


def parse_content(content: object) -> list[Part]:
    if isinstance(content, str):
        return [content]
    if not isinstance(content, list) or not content:
        raise ValueError("content must be a string or a non-empty list of parts")
    return [parse_part(p) for p in content]


def parse_part(part: object) -> Part:
    if not isinstance(part, dict):
        raise ValueError(f"a part must be an object with a type, got {type(part).__name__}")
    kind = part.get("type")
    if kind == "text" and isinstance(part.get("text"), str) and set(part) == {"type", "text"}:
        return str(part["text"])
    if kind == "image_url" and set(part) == {"type", "image_url"}:
        image = part["image_url"]
        url = image.get("url") if isinstance(image, dict) else image
        if isinstance(url, str):
            return ImageURL(url)
    raise ValueError(
        'a part must be {"type": "text", "text": "..."} or '
        '{"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}}'
    )


def messages_to_input(data: dict[str, Any]) -> dict[str, Any]:
    """vLLM's chat-embedding body -> ours: the user messages' parts are one input, a system
    message is the instruction (`prompt`)."""
    if "messages" not in data or not isinstance(data, dict):
        return data
    if "input" in data:
        raise ValueError("pass either input or messages, not both")
    out = {k: v for k, v in data.items() if k != "messages"}
    messages = data["messages"]
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages must be a non-empty list")
    parts: list[Part] = []
    for m in messages:
        if not isinstance(m, dict) or m.get("role") not in ("system", "user") or "content" not in m:
            raise ValueError('each message needs a role ("system" or "user") and content')
        if m["role"] == "system":
            if "prompt" in out:
                raise ValueError("one system message (the instruction) at most, and not with prompt")
            texts = parse_content(m["content"])
            if not all(isinstance(t, str) for t in texts):
                raise ValueError("a system message holds text only")
            out["prompt"] = "".join(str(t) for t in texts)
        else:
            parts += parse_content(m["content"])
    if not parts:
        raise ValueError("messages hold no user content")
    out["input"] = [{"content": [_as_json(p) for p in parts]}]
    return out


def _as_json(p: Part) -> dict[str, Any]:
    if isinstance(p, str):
        return {"type": "text", "text": p}
    return {"type": "image_url", "image_url": {"url": p.url}}


def resolve_items(items: list[Any]) -> list[Any]:
    """Items with their images' data URIs decoded into bytes (the engine decodes those);
    strings and token-id lists unchanged."""
    return [_resolve(x) if _is_parts(x) else x for x in items]


def _is_parts(item: object) -> bool:
    return isinstance(item, list) and bool(item) and isinstance(item[0], (str, ImageURL))


def _resolve(item: list[Part]) -> list[str | ImagePart]:
    return [p if isinstance(p, str) else ImagePart(image_bytes(p.url)) for p in item]


def to_json(item: Any) -> Any:
    """An item as the API takes it (a part list back to a content item): a pool's request body."""
    return {"content": [_as_json(p) for p in item]} if _is_parts(item) else item


def image_size(url: str) -> tuple[int, int]:
    """(width, height) from the image's header: the gateway counts its tokens without decoding."""
    from PIL import Image

    try:
        with Image.open(io.BytesIO(image_bytes(url)), formats=list(FORMATS)) as img:
            return img.size
    except InvalidInputError:
        raise
    except Exception:
        raise InvalidInputError(f"image cannot be decoded: not a valid {', '.join(FORMATS)} file") from None


def image_bytes(url: str) -> bytes:
    if url.startswith(("http://", "https://", "file:", "ftp:")):
        raise InvalidInputError(
            "remote image URLs are not fetched by this server; send the image as a data URI "
            "(data:image/png;base64,...)"
        )
    m = _DATA_URI.fullmatch(url)
    if m is None:
        raise InvalidInputError("an image URL must be a data URI (data:image/png;base64,...)")
    mime = (m["mime"] or "").lower()
    if mime not in MIME_TYPES:
        raise InvalidInputError(f"unsupported image type {mime or 'none'!r}; send PNG, JPEG or WebP")
    if ";base64" not in (m["params"] or ""):
        raise InvalidInputError("an image data URI must be base64-encoded (data:image/png;base64,...)")
    try:
        return base64.b64decode(m["data"], validate=True)
    except (binascii.Error, ValueError):
        raise InvalidInputError("the image data URI is not valid base64") from None
