"""`/openapi.json` entries of TEI's `/similarity` and `/decode`, and of the paths whose body picks
the route (TEI's `POST /`, vLLM's `POST /invocations`: api/dispatch.py)."""

from __future__ import annotations

from typing import Any

from pydantic import RootModel

from embedserve.api.openapi_routes import inlined_schema, route_doc
from embedserve.api.tei_similarity import DecodeRequest, SimilarityRequest


class Similarities(RootModel[list[float]]):
    """TEI's `/similarity` answer: each sentence's cosine to the source sentence, in order."""


class Texts(RootModel[list[str]]):
    """TEI's `/decode` answer: one text per id list."""


class AnyAnswer(RootModel[Any]):
    """The answer of the route the body picked."""


def similarity_route(max_inputs: int, statuses: tuple[int, ...]) -> dict[str, Any]:
    """Keyword arguments of `POST /similarity` (TEI's sentence-similarity API)."""
    request = inlined_schema(SimilarityRequest, max_inputs, None)
    request["properties"]["inputs"]["properties"]["sentences"]["maxItems"] = max(max_inputs - 1, 1)
    return route_doc("Cosine of sentences to a source sentence (TEI's API)", request, Similarities, statuses)


def decode_route(max_inputs: int, statuses: tuple[int, ...]) -> dict[str, Any]:
    """Keyword arguments of `POST /decode` (TEI's)."""
    request = inlined_schema(DecodeRequest, max_inputs, "ids")
    return route_doc("Token ids back to texts (TEI's API)", request, Texts, statuses)


def dispatch_route(summary: str, requests: list[dict[str, Any]], statuses: tuple[int, ...]) -> dict[str, Any]:
    """A path answering any of `requests`' bodies, as the route it picks."""
    return route_doc(summary, {"anyOf": requests}, AnyAnswer, statuses)
