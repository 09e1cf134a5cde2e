"""`POST /tokenize`, `POST /detokenize` and TEI's `POST /decode` through the gateway: placed
whole on the pools of the longest input (any pool serves the same model, so any pool's
tokenizer answers), the pool's answer as it is. Over-long inputs are still placed (on the
largest pool): tokenizing them is no engine work."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from embedserve.api.multimodal import to_json
from embedserve.api.routes import DECODE, DETOKENIZE, TOKENIZE
from embedserve.api.tei_similarity import DecodeRequest
from embedserve.api.tokenize import DetokenizeRequest, TokenizeRequest
from embedserve.gateway.routes.jobs import WholeJob
from embedserve.gateway.routes.pipeline import GatewayRoute, Pipeline


class TokenizeJob(WholeJob[TokenizeRequest]):
    def __init__(self, gw: Pipeline, req: TokenizeRequest) -> None:
        super().__init__(req, req.model, len(req.items), "end")
        self.counter = gw.counter

    def count(self) -> list[int]:
        req = self.req
        return self.counter.count(req.items, self.counter.resolve_prompt(req.prompt_name, None))

    def payload(self, indices: Sequence[int], traffic_class: str) -> dict[str, Any]:
        body = super().payload(indices, traffic_class)
        if "input" in body:  # parsed content parts back to the API's shape
            body["input"] = to_json(self.req.input)
        return body


class DetokenizeJob(WholeJob[DetokenizeRequest]):
    def __init__(self, gw: Pipeline, req: DetokenizeRequest) -> None:
        super().__init__(req, req.model, 1, "end")

    def count(self) -> list[int]:
        return [len(self.req.tokens)]


class DecodeJob(WholeJob[DecodeRequest]):
    def __init__(self, gw: Pipeline, req: DecodeRequest) -> None:
        super().__init__(req, req.model, len(req.batch), "end")

    def count(self) -> list[int]:
        return [len(ids) for ids in self.req.batch]


TOKENIZE_ROUTE = GatewayRoute(TOKENIZE, TokenizeJob)
DECODE_ROUTE = GatewayRoute(DECODE, DecodeJob)
DETOKENIZE_ROUTE = GatewayRoute(DETOKENIZE, DetokenizeJob)
