"""Wire format of `POST /tokenize` and `POST /detokenize`: vLLM's shapes, and TEI's on the same
path (the body's fields pick the shape; both documented in README.md).

    vLLM  {"model", "prompt": str | "input": one embeddings input (text or content parts),
           "add_special_tokens", "prompt_name", "truncate", "return_offsets"}
          -> {"tokens", "count", "max_model_len", "offsets"?}
    TEI   {"inputs": str | [str], "add_special_tokens", "prompt_name"}
          -> [[{"id", "text", "special", "start", "stop"}] per input]
    vLLM  /detokenize {"model", "tokens"} -> {"prompt"}

The count applies the rules `/v1/embeddings` bills by (the prompt of `prompt_name` or the
model's default prompt, special tokens, image tokens), so `count` equals that route's
`usage.prompt_tokens` for the same input. `truncate` is absent by default: the whole input is
counted (an input over `max_model_len` is still answered, and the client sees both numbers);
"end" / "start" cut it as `/v1/embeddings` would.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from embedserve.api.multimodal import Item, parse_content, parse_item
from embedserve.api.protocol import Text, Texts, TokenId


def _one_input(value: object) -> str | Item:
    """One embeddings input: a string, a content item, or a list of text / image parts."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        return parse_item(value)
    if isinstance(value, list) and value and all(isinstance(p, dict) for p in value):
        return parse_content(value)
    raise ValueError(
        "input must be one text or one content item (a list of text / image parts): tokenize "
        "takes one input per request (TEI's `inputs` takes a list of texts)"
    )


class TokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    model: str | None = None
    prompt: Text | None = None  # vLLM: the text to tokenize (not an instruction prompt)
    input: Any = None  # one embeddings input; with images, content parts
    inputs: Texts | None = None  # TEI
    add_special_tokens: bool = True
    prompt_name: str | None = None
    truncate: Literal["end", "start"] | None = None
    return_offsets: bool = False

    _validate_input = field_validator("input", mode="plain")(lambda v: None if v is None else _one_input(v))

    @model_validator(mode="after")
    def _one_source(self) -> TokenizeRequest:
        given = [k for k in ("prompt", "input", "inputs") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(
                "give exactly one of `prompt` or `input` (vLLM's shape) or `inputs` (TEI's); got "
                + (" and ".join(given) or "none")
            )
        return self

    @property
    def tei(self) -> bool:
        return self.inputs is not None

    @property
    def items(self) -> list[str | Item]:
        if self.inputs is not None:
            return [self.inputs] if isinstance(self.inputs, str) else list(self.inputs)
        return [self.prompt if self.prompt is not None else self.input]


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    model: str | None = None
    tokens: list[TokenId] = Field(min_length=1)


@dataclass(frozen=True)
class Tokens:
    """One input's tokens as a route answers them."""

    ids: list[int]
    offsets: list[tuple[int, int]] | None  # character spans in `text` (None: an image input)
    special: list[bool] | None
    text: str  # what the offsets index: the prompt + the input's text


def tokenize_body(req: TokenizeRequest, tokens: list[Tokens], max_model_len: int) -> Any:
    """vLLM's body for one input, or TEI's list of token lists."""
    if req.tei:
        return [_tei_tokens(t) for t in tokens]
    (one,) = tokens
    body: dict[str, Any] = {"tokens": one.ids, "count": len(one.ids), "max_model_len": max_model_len}
    if req.return_offsets:
        body["offsets"] = None if one.offsets is None else [list(o) for o in one.offsets]
    return body


def _tei_tokens(t: Tokens) -> list[dict[str, Any]]:
    spans = t.offsets or [(0, 0)] * len(t.ids)
    special = t.special or [False] * len(t.ids)
    return [
        {"id": i, "text": t.text[a:b], "special": s, "start": a, "stop": b}
        for i, (a, b), s in zip(t.ids, spans, special, strict=True)
    ]


class TokenizeResponse(BaseModel):
    """vLLM's shape (TEI's is a list per input of {id, text, special, start, stop})."""

    tokens: list[int]
    count: int
    max_model_len: int
    offsets: list[list[int]] | None = Field(default=None, description="with return_offsets")


class DetokenizeResponse(BaseModel):
    prompt: str
