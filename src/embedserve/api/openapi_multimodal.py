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
# One input's content is never empty: a non-empty string, or parts of which one is an image or a
# non-empty text (the tokenizer refuses an empty text; a message's parts join the others').
_SOME_TEXT: dict[str, Any] = {
    **TEXT_PART,
    "properties": {**TEXT_PART["properties"], "text": {"type": "string", "minLength": 1}},
}
_ANY_CONTENT: dict[str, Any] = {"anyOf": [{"type": "string"}, PARTS]}
CONTENT: dict[str, Any] = {
    "anyOf": [{"type": "string", "minLength": 1}, {**PARTS, "contains": {"anyOf": [IMAGE_PART, _SOME_TEXT]}}]
}
CONTENT_ITEM: dict[str, Any] = {
    "title": "ContentItem",
    "description": "one input of text and image parts in order (one vector)",
    "type": "object",
    "required": ["content"],
    "additionalProperties": False,
    "properties": {"content": CONTENT, "role": {"description": "accepted and ignored"}},
}
ITEM: dict[str, Any] = {"anyOf": [IMAGE_PART, _SOME_TEXT, CONTENT_ITEM]}  # one input each


def multimodal_inputs(max_inputs: int) -> list[dict[str, Any]]:
    """The input shapes with images: one image / content item, or a list mixing them with strings."""
    listed = {"anyOf": [{"type": "string", "minLength": 1}, ITEM]}
    return [ITEM, {"type": "array", "minItems": 1, "maxItems": max_inputs, "items": listed}]


SYSTEM: dict[str, Any] = {
    "type": "object",
    "required": ["role", "content"],
    "properties": {
        "role": {"const": "system"},
        "content": {"anyOf": [{"type": "string"}, {**PARTS, "items": TEXT_PART}]},
    },
}
MESSAGES: dict[str, Any] = {
    "description": "vLLM's chat-embedding body instead of input: the user messages' parts are one "
    "input, a system message (one at most, not with prompt) its instruction",
    "type": "array",
    "minItems": 1,
    "maxContains": 1,  # of SYSTEM (below): the one instruction
    "minContains": 0,
    "items": {
        "anyOf": [
            SYSTEM,
            {
                "type": "object",
                "required": ["role", "content"],
                "properties": {"role": {"const": "user"}, "content": _ANY_CONTENT},
            },
        ]
    },
    "contains": SYSTEM,
    "allOf": [
        {
            "contains": {
                "type": "object",
                "required": ["role", "content"],
                "properties": {"role": {"const": "user"}, "content": CONTENT},
            }
        }
    ],
}


def with_messages(schema: dict[str, Any]) -> dict[str, Any]:
    """The request body: `input` or `messages`, not both."""
    schema["properties"]["messages"] = MESSAGES
    schema.pop("required", None)
    schema["oneOf"] = [{"required": ["input"]}, {"required": ["messages"]}]
    # a system message is the instruction: not beside `prompt`, nor a prompt_name that is not null
    no_system = {"properties": {"messages": {"not": {"contains": SYSTEM}}}}
    schema["dependentSchemas"] = {
        **schema.get("dependentSchemas", {}),
        "prompt": no_system,
        "prompt_name": {"anyOf": [{"properties": {"prompt_name": {"type": "null"}}}, no_system]},
    }
    return schema
