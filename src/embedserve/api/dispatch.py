"""Paths whose body picks the route: TEI's `POST /` and vLLM's `POST /invocations` (SageMaker).

    POST /             by the served model's kind, as TEI's router: an embedding model's body
                       is /embed's, or /similarity's when `inputs` holds `source_sentence`; a
                       reranker's is /rerank's, a classifier's /predict's. huggingface_hub's
                       `{"inputs", "parameters"}` bodies are read too (api/tei_similarity.py).
    POST /invocations  by the body's keys, as vLLM's: `query` -> /v1/rerank, `text_1` / `text_2`
                       -> /v1/score, `input` / `messages` -> /v1/embeddings (a classifier's or a
                       reranker's: /classify).

The server and the gateway run the picked route as if the body had come to its own path: the
same parsing, limits, counting and answer.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from embedserve.api.openapi_tei import dispatch_route
from embedserve.api.protocol import ApiError
from embedserve.api.routes import CLASSIFY, EMBEDDINGS, PREDICT, RERANK, SCORE, SIMILARITY, TEI_EMBED, Route
from embedserve.api.tei_similarity import hub_body

Picked = tuple[Route[Any], bytes]


@dataclass(frozen=True)
class Dispatch:
    name: str
    path: str
    pick: Callable[[bytes, str], Picked]  # (body, the served model's task) -> the route, its body
    summary: str
    # the routes it may pick for a model of each task: its `/openapi.json` body lists their bodies
    by_task: dict[str, tuple[Route[Any], ...]]

    def routes(self, tasks: frozenset[str] | None = None) -> tuple[Route[Any], ...]:
        """The routes it picks for models of `tasks` (default: any), each once, in order."""
        picked = [
            r for task, routes in self.by_task.items() if tasks is None or task in tasks for r in routes
        ]
        return tuple(dict.fromkeys(picked))

    def doc(
        self, max_inputs: int, statuses: tuple[int, ...], candidates: tuple[Route[Any], ...] | None = None
    ) -> dict[str, Any]:
        """`candidates`: the routes a served model's bodies go to (default: every one it picks)."""
        requests: list[dict[str, Any]] = []
        for route in self.routes() if candidates is None else candidates:
            schema = route.doc(max_inputs, statuses)["openapi_extra"]["requestBody"]["content"]
            body = schema["application/json"]["schema"]
            requests += body.get("anyOf", [body])
        return dispatch_route(self.summary, requests, statuses)


def _tei_root(body: bytes, task: str) -> Picked:
    raw, body = hub_body(body)
    if task == "embed":
        inputs = raw.get("inputs") if isinstance(raw, dict) else None
        return (SIMILARITY if isinstance(inputs, dict) else TEI_EMBED), body
    return (RERANK if task == "rerank" else PREDICT), body


def _invocations(body: bytes, task: str) -> Picked:
    try:
        raw = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return EMBEDDINGS, body  # its parser names the JSON error
    keys = set(raw) if isinstance(raw, dict) else set()
    if "query" in keys:
        return RERANK, body
    if keys & {"text_1", "text_2"}:
        return SCORE, body
    if keys & {"input", "messages"}:
        return (EMBEDDINGS if task == "embed" else CLASSIFY), body
    raise ApiError(
        400,
        "POST /invocations picks its route by the body: `input` or `messages` (embeddings; a "
        "classifier's classify), `query` + `documents` (rerank) or `text_1` + `text_2` (score)",
    )


TEI_ROOT = Dispatch(
    name="tei_root",
    path="/",
    pick=_tei_root,
    summary="TEI's base route: /embed, /similarity, /rerank or /predict by the model's kind",
    by_task={"embed": (TEI_EMBED, SIMILARITY), "rerank": (RERANK,), "classify": (PREDICT,)},
)
INVOCATIONS = Dispatch(
    name="invocations",
    path="/invocations",
    pick=_invocations,
    summary="SageMaker's route (vLLM's): embeddings, classify, rerank or score by the body",
    by_task={
        "embed": (EMBEDDINGS, SCORE, RERANK),
        "rerank": (CLASSIFY, RERANK, SCORE),
        "classify": (CLASSIFY,),
    },
)
DISPATCHES: tuple[Dispatch, ...] = (TEI_ROOT, INVOCATIONS)
