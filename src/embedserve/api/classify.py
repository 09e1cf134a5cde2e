"""Wire format of `POST /classify` (vLLM's shape) and `POST /predict` (TEI's), both answered by a
`*ForSequenceClassification` model (engine/classify.py; a one-label cross-encoder too).

    /classify  {"model", "input": str | [str], "truncate", "raw_scores", "priority"}
               -> {"id", "object": "list", "created", "model", "data": [{"index", "label",
                  "probs", "num_classes"}], "usage", + the metadata}
    /predict   {"inputs": str | [a, b] (one pair) | [[str] | [a, b], ...] (a batch),
                "raw_scores", "truncate": bool, "truncation_direction"}
               -> [{"score", "label"}] best first for one input; a list of those for a batch
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, WithJsonSchema, model_validator

from embedserve.api.protocol import TEXT_SCHEMA, Texts, listed
from embedserve.api.tei import Direction, policy
from embedserve.errors import API_REMEDY, TEI_REMEDY

Input = str | tuple[str, str]  # a text, or a (text, text_pair) pair
# TEI's `/predict` inputs as `_shape` reads them: a text, one (text, text_pair) pair, or a batch
# of texts and pairs
_PAIR = {"type": "array", "items": TEXT_SCHEMA, "minItems": 1, "maxItems": 2}
_PREDICT_INPUTS = {
    "anyOf": [
        TEXT_SCHEMA,
        {"type": "array", "items": TEXT_SCHEMA, "minItems": 2, "maxItems": 2},
        {"type": "array", "items": _PAIR, "minItems": 1},
    ]
}


class ClassifyRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    input: Texts
    model: str | None = None
    truncate: Literal["error", "end", "start"] = "error"
    raw_scores: bool = False
    priority: Literal["online", "batch"] = "online"

    @property
    def items(self) -> list[Input]:
        return [self.input] if isinstance(self.input, str) else list(self.input)

    @property
    def policy(self) -> Literal["error", "end", "start"]:
        """The over-long policy (TEI's body, `PredictRequest`, says it another way)."""
        return self.truncate

    truncate_remedy: ClassVar[str] = API_REMEDY  # the hint of an over-long input's 400


class PredictRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    inputs: Annotated[str | list[str] | list[list[str]], WithJsonSchema(_PREDICT_INPUTS)]
    model: str | None = None
    raw_scores: bool = False
    truncate: bool | None = False
    truncation_direction: Direction = "Right"
    truncate_remedy: ClassVar[str] = TEI_REMEDY

    @model_validator(mode="after")
    def _shape(self) -> PredictRequest:
        inputs = self.inputs
        if isinstance(inputs, list) and not inputs:
            raise ValueError("inputs is empty")
        if isinstance(inputs, list) and isinstance(inputs[0], str) and len(inputs) != 2:
            raise ValueError(
                "a list of strings is one (text, text_pair) pair: two strings; a batch is a list of lists"
            )
        if isinstance(inputs, list) and isinstance(inputs[0], list):
            bad = next((i for i, x in enumerate(inputs) if len(x) not in (1, 2)), None)
            if bad is not None:
                raise ValueError(f"inputs[{bad}]: one text or a (text, text_pair) pair")
        return self

    @property
    def batch(self) -> bool:
        return isinstance(self.inputs, list) and isinstance(self.inputs[0], list)

    @property
    def items(self) -> list[Input]:
        inputs = self.inputs
        if isinstance(inputs, str):
            return [inputs]
        if not self.batch:
            return [(str(inputs[0]), str(inputs[1]))]
        return [x[0] if len(x) == 1 else (x[0], x[1]) for x in inputs if isinstance(x, list)]

    @property
    def policy(self) -> Literal["error", "end", "start"]:
        return policy(self.truncate, self.truncation_direction)


def classify_body(
    results: list[tuple[str, list[float]]], n_tokens: int, metadata: dict[str, Any]
) -> dict[str, Any]:
    """vLLM's body: (label, probs) per input, in input order."""
    data = [
        {"index": i, "label": label, "probs": probs, "num_classes": len(probs)}
        for i, (label, probs) in enumerate(results)
    ]
    return listed("classify", data, n_tokens, metadata)


def predict_body(req: PredictRequest, labels: tuple[str, ...], probs: list[list[float]]) -> Any:
    """TEI's body: each input's labels with their scores, best first."""
    answers = [
        [
            {"score": p, "label": label}
            for p, label in sorted(zip(row, labels, strict=True), key=lambda x: -x[0])
        ]
        for row in probs
    ]
    return answers if req.batch else answers[0]
