"""What `/openapi.json` says about text + image inputs of `/v1/embeddings`: image and content
items (as `api/multimodal.py` parses them) and vLLM's chat-embedding body (`messages`)."""

from __future__ import annotations

from typing import Any

TEXT_PART: dict[str, Any] = {
    "title": "TextPart",
    "type": "object",
    "required": ["type", "text"],
    "additionalProperties": False,
    "properties": {"type": {"const": "text"}, "text": {"type": "string"}},
}
_DATA_URI = {
    "type": "string",
    "pattern": "^data:",
    "description": "a data URI of a PNG, JPEG or WebP image (data:image/png;base64,...); remote URLs "
    "are refused with 400 (the server fetches nothing)",
}
IMAGE_PART: dict[str, Any] = {
    "title": "ImagePart",
    "type": "object",
    "required": ["type", "image_url"],
    "additionalProperties": False,
    "properties": {
        "type": {"const": "image_url"},
        "image_url": {
            "anyOf": [{"type": "object", "required": ["url"], "properties": {"url": _DATA_URI}}, _DATA_URI]
        },
    },
}
PARTS: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"anyOf": [TEXT_PART, IMAGE_PART]}}
CONTENT: dict[str, Any] = {"anyOf": [{"type": "string"}, PARTS]}
CONTENT_ITEM: dict[str, Any] = {
    "title": "ContentItem",
    "description": "one input of text and image parts in order (one vector)",
    "type": "object",
    "required": ["content"],
    "additionalProperties": False,
    "properties": {"content": CONTENT, "role": {"description": "accepted and ignored"}},
}
ITEM: dict[str, Any] = {"anyOf": [IMAGE_PART, TEXT_PART, CONTENT_ITEM]}


def multimodal_inputs(max_inputs: int) -> list[dict[str, Any]]:
    """The input shapes with images: one image / content item, or a list mixing them with strings."""
    listed = {"anyOf": [{"type": "string", "minLength": 1}, ITEM]}
    return [ITEM, {"type": "array", "minItems": 1, "maxItems": max_inputs, "items": listed}]


MESSAGES: dict[str, Any] = {
    "description": "vLLM's chat-embedding body instead of input: the user messages' parts are one "
    "input, a system message (one at most, not with prompt) its instruction",
    "type": "array",
    "minItems": 1,
    "items": {
        "anyOf": [
            {
                "type": "object",
                "required": ["role", "content"],
                "properties": {
                    "role": {"const": "system"},
                    "content": {"anyOf": [{"type": "string"}, {**PARTS, "items": TEXT_PART}]},
                },
            },
            {
                "type": "object",
                "required": ["role", "content"],
                "properties": {"role": {"const": "user"}, "content": CONTENT},
            },
        ]
    },
}


def with_messages(schema: dict[str, Any]) -> dict[str, Any]:
    """The request body: `input` or `messages`, not both."""
    schema["properties"]["messages"] = MESSAGES
    schema.pop("required", None)
    schema["oneOf"] = [{"required": ["input"]}, {"required": ["messages"]}]
    return schema
