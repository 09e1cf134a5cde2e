"""What a route's request brings to the gateway's template (gateway/routes/pipeline.py): a `Job`, made
per request by the route's module (embeddings.py, cohere_embed.py, rerank.py).

A job says only what differs between routes: how its inputs are counted (texts with a prompt,
pairs), a part's upstream body for some of its inputs, and one client body from the parts'
answers. A `WholeJob` (a route placed whole) needs only its counting: the pool gets the request
as the client sent it, and the client gets the pool's answer as it is.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, Generic

from embedserve.api.routes import Req
from embedserve.errors import API_REMEDY
from embedserve.gateway.pools.counting import TokenCounter
from embedserve.gateway.pools.forward import PartResult


class Job(ABC, Generic[Req]):
    """One parsed request of a route. The constructor only reads the request (refusals belong in
    `count`, which runs in a worker thread and may raise InvalidInputError / InputTooLongError)."""

    def __init__(self, req: Req, model: str | None, n_inputs: int, truncate: str) -> None:
        self.req = req
        self.model = model  # the request's `model` field
        self.n_inputs = n_inputs  # inputs before counting (the per-request limit)
        self.truncate = truncate  # the over-long policy: "error", "end" or "start"

    @property
    def truncate_remedy(self) -> str:
        """How this route's body asks to cut an over-long input (errors.py: its 400's hint)."""
        return API_REMEDY

    @abstractmethod
    def count(self) -> list[int]:
        """Tokens per input, as the pools' engines will count them."""

    @abstractmethod
    def payload(self, indices: Sequence[int], traffic_class: str) -> dict[str, Any]:
        """The upstream request body for the inputs at `indices` (positions in the request)."""

    @abstractmethod
    def body(self, results: Sequence[PartResult], counts: Sequence[int], name: str | None) -> Any:
        """The client's body from every part's answer (`name`: the gateway's model name)."""


class WholeJob(Job[Req]):
    """A request one pool answers whole: the pool's answer as it is, named as the gateway names
    its model."""

    def payload(self, indices: Sequence[int], traffic_class: str) -> dict[str, Any]:
        # The client's options as sent (defaults left to the upstream); `model` is dropped because
        # each upstream may serve the model under its own name (the schema guard vouches for it).
        body = self.req.model_dump(exclude_unset=True, exclude={"model", "priority"})
        if "priority" in type(self.req).model_fields:
            body["priority"] = traffic_class
        return body

    def body(self, results: Sequence[PartResult], counts: Sequence[int], name: str | None) -> Any:
        (result,) = results
        body = result.body
        if isinstance(body, dict) and "model" in body and name is not None:
            return {**body, "model": name}  # the model as the gateway's clients know it
        return body


class TextsJob(WholeJob[Req]):
    """A whole request of texts under one prompt (`prompt_name`), counted as the pool counts
    them: the prompt and special tokens included. `remedy`: its body's truncate hint."""

    def __init__(
        self,
        req: Req,
        counter: TokenCounter,
        texts: list[str],
        prompt_name: str | None,
        truncate: str,
        remedy: str = API_REMEDY,
    ) -> None:
        super().__init__(req, getattr(req, "model", None), len(texts), truncate)
        self.counter = counter
        self.texts = texts
        self.prompt_name = prompt_name
        self.remedy = remedy

    @property
    def truncate_remedy(self) -> str:
        return self.remedy

    def count(self) -> list[int]:
        return self.counter.count(self.texts, self.counter.resolve_prompt(self.prompt_name, None))
