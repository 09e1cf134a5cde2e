"""The API's POST routes, each declared once: its paths, the request model it parses, the engine
task it needs, how a gateway places it, its `/openapi.json` entry and what a complete answer
holds; `output` / `also`: what the model must emit (`/openapi.json` of a served model lists the
routes it serves: api/openapi_contract.py). The server, the gateway, the Ray Serve replica and
the gateway's 404 text take their route list from `ROUTES`; the shared refusals are worded here.

    route          paths                              tasks          gateway placement
    embeddings     /v1/embeddings, /embeddings        embed          split: each input to its pool
    cohere_embed   /v2/embed                          embed          split: each text to its pool
    rerank         /v1/rerank, /rerank, /v2/rerank    rerank, MaxSim whole: the pool of the longest pair
    classify       /classify                          classify, rerank  whole: the pool of the longest input
    predict        /predict (TEI's)                   classify, rerank  whole
    score          /v1/score, /score                  embed, rerank  whole: the pool of the longest pair
    tei_embed      /embed                             embed          split (as /v1/embeddings)
    tei_embed_sparse /embed_sparse (SPLADE)           embed          split (as /v1/embeddings)
    tokenize       /tokenize                          any            whole
    detokenize     /detokenize                        any            whole
    similarity     /similarity (TEI's)                embed          whole
    decode         /decode (TEI's)                    any            whole
    embed_all      /embed_all (TEI's: token vectors)  embed          whole
    pooling        /pooling (vLLM's)                  embed          whole

TEI's `POST /` and vLLM's `POST /invocations` are not routes of their own: their body (and the
model's task) picks one of these (api/dispatch.py). Two peers' bodies on one path (TEI's and
Cohere's `/rerank`, TEI's and vLLM's `/tokenize`) are one route: its parser reads either, and the
answer takes the shape of the body it got.

Adding a route: its request model (api/), a `Route` in `ROUTES`, one server module with its Job
(server/pipeline.py's template; listed in server/routes.py), its Job through the gateway
(gateway/routes/pipeline.py's; a route placed whole only counts its inputs; listed in gateway/app.py),
tests. A declared route that the server or the gateway cannot run stops them at start-up.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, Generic, Literal, TypeVar

from pydantic import BaseModel

from embedserve.api import answers
from embedserve.api.classify import ClassifyRequest, PredictRequest
from embedserve.api.cohere import CohereEmbedRequest
from embedserve.api.openapi import embeddings_route
from embedserve.api.openapi_routes import (
    classify_route,
    cohere_embed_route,
    detokenize_route,
    predict_route,
    rerank_route,
    score_route,
    tei_embed_route,
    tei_embed_sparse_route,
    tokenize_route,
)
from embedserve.api.openapi_tei import decode_route, embed_all_route, pooling_route, similarity_route
from embedserve.api.protocol import EmbeddingRequest, parse_body
from embedserve.api.rerank import RerankRequest
from embedserve.api.score import ScoreRequest
from embedserve.api.tei import TeiEmbedRequest, TeiEmbedSparseRequest, parse_rerank
from embedserve.api.tei_similarity import DecodeRequest, SimilarityRequest
from embedserve.api.token_outputs import EmbedAllRequest, PoolingRequest
from embedserve.api.tokenize import DetokenizeRequest, TokenizeRequest

Req = TypeVar("Req", bound=BaseModel)
Task = Literal["embed", "rerank", "classify"]
ANY_TASK: tuple[Task, ...] = ("embed", "rerank", "classify")
# "split": a gateway sends each input to the smallest pool that fits it and reassembles the
# answers in order; "whole": the request goes to one pool, chosen by its longest input.
Placement = Literal["split", "whole"]

EMBEDDINGS_PATH = "/v1/embeddings"
COHERE_EMBED_PATH = "/v2/embed"
RERANK_PATH = "/v1/rerank"


@dataclass(frozen=True)
class Route(Generic[Req]):
    name: str
    path: str  # the primary path: the one a gateway sends its parts to
    parse: Callable[[bytes], Req]  # 400 bad JSON, 422 wrong shape
    tasks: tuple[Task, ...]  # the models' tasks it serves
    placement: Placement
    # `/openapi.json` keyword arguments: (per-request input limit, statuses answered).
    doc: Callable[[int, tuple[int, ...]], dict[str, Any]]
    # Whether a 200 body answers every one of `n` inputs (a gateway checks each pool's answer).
    answers: Callable[[Any, int], bool]
    aliases: tuple[str, ...] = ()
    output: str | None = None  # what the model must emit besides its task (dense; `/embed_sparse`: sparse)
    also: str | None = None  # an output that serves it in a model of another task (rerank: multivector)

    @property
    def paths(self) -> tuple[str, ...]:
        return (self.path, *self.aliases)


EMBEDDINGS: Route[EmbeddingRequest] = Route(
    name="embeddings",
    path=EMBEDDINGS_PATH,
    aliases=("/embeddings",),  # Infinity's path
    parse=partial(parse_body, EmbeddingRequest),
    tasks=("embed",),
    placement="split",
    doc=embeddings_route,
    answers=answers.one_vector_per_input,
)
COHERE_EMBED: Route[CohereEmbedRequest] = Route(
    name="cohere_embed",
    path=COHERE_EMBED_PATH,
    parse=partial(parse_body, CohereEmbedRequest),
    tasks=("embed",),
    placement="split",
    doc=cohere_embed_route,
    answers=answers.one_vector_per_text,
)
RERANK: Route[RerankRequest] = Route(
    name="rerank",
    path=RERANK_PATH,
    aliases=("/rerank", "/v2/rerank"),
    parse=parse_rerank,
    tasks=("rerank",),
    placement="whole",
    doc=rerank_route,
    answers=answers.ranks_within,
    also="multivector",  # MaxSim over a multi-vector embedding model's token vectors
)
CLASSIFY: Route[ClassifyRequest] = Route(
    name="classify",
    path="/classify",
    parse=partial(parse_body, ClassifyRequest),
    tasks=("classify", "rerank"),
    placement="whole",
    doc=classify_route,
    answers=answers.one_answer_each,
)
PREDICT: Route[PredictRequest] = Route(
    name="predict",
    path="/predict",
    parse=partial(parse_body, PredictRequest),
    tasks=("classify", "rerank"),
    placement="whole",
    doc=predict_route,
    answers=answers.labels_of_each,
)
SCORE: Route[ScoreRequest] = Route(
    name="score",
    path="/v1/score",
    aliases=("/score",),
    parse=partial(parse_body, ScoreRequest),
    tasks=("embed", "rerank"),
    placement="whole",
    doc=score_route,
    answers=answers.one_answer_each,
    output="dense",
)
TEI_EMBED: Route[TeiEmbedRequest] = Route(
    name="tei_embed",
    path="/embed",
    parse=partial(parse_body, TeiEmbedRequest),
    tasks=("embed",),
    placement="split",
    doc=tei_embed_route,
    answers=answers.one_vector_each,
    output="dense",
)
TEI_EMBED_SPARSE: Route[TeiEmbedSparseRequest] = Route(
    name="tei_embed_sparse",
    path="/embed_sparse",
    parse=partial(parse_body, TeiEmbedSparseRequest),
    tasks=("embed",),
    placement="split",
    doc=tei_embed_sparse_route,
    answers=answers.one_vector_each,
    output="sparse",
)
TOKENIZE: Route[TokenizeRequest] = Route(
    name="tokenize",
    path="/tokenize",
    parse=partial(parse_body, TokenizeRequest),
    tasks=ANY_TASK,
    placement="whole",
    doc=tokenize_route,
    answers=answers.tokens_of_each,
)
DETOKENIZE: Route[DetokenizeRequest] = Route(
    name="detokenize",
    path="/detokenize",
    parse=partial(parse_body, DetokenizeRequest),
    tasks=ANY_TASK,
    placement="whole",
    doc=detokenize_route,
    answers=answers.text,
)
SIMILARITY: Route[SimilarityRequest] = Route(
    name="similarity",
    path="/similarity",
    parse=partial(parse_body, SimilarityRequest),
    tasks=("embed",),
    placement="whole",
    doc=similarity_route,
    answers=answers.one_score_each_sentence,
    output="dense",
)
DECODE: Route[DecodeRequest] = Route(
    name="decode",
    path="/decode",
    parse=partial(parse_body, DecodeRequest),
    tasks=ANY_TASK,
    placement="whole",
    doc=decode_route,
    answers=answers.texts_of_each,
)
EMBED_ALL: Route[EmbedAllRequest] = Route(
    name="embed_all",
    path="/embed_all",
    parse=partial(parse_body, EmbedAllRequest),
    tasks=("embed",),
    placement="whole",
    doc=embed_all_route,
    answers=answers.one_vector_each,
    output="dense",
)
POOLING: Route[PoolingRequest] = Route(
    name="pooling",
    path="/pooling",
    parse=partial(parse_body, PoolingRequest),
    tasks=("embed",),
    placement="whole",
    doc=pooling_route,
    answers=answers.one_answer_each,
    output="dense",
)
# A model's task is served first by the route listed first for it (`wrong_task` points there).
ROUTES: tuple[Route[Any], ...] = (
    EMBEDDINGS,
    COHERE_EMBED,
    RERANK,
    CLASSIFY,
    PREDICT,
    SCORE,
    TEI_EMBED,
    TEI_EMBED_SPARSE,
    TOKENIZE,
    DETOKENIZE,
    SIMILARITY,
    DECODE,
    EMBED_ALL,
    POOLING,
)

_BY_PATH = {path: route for route in ROUTES for path in route.paths}
if len(_BY_PATH) != sum(len(r.paths) for r in ROUTES):
    raise AssertionError("two routes declare the same path")


def route_at(path: str) -> Route[Any] | None:
    """The route that answers `path` (a primary path or an alias)."""
    return _BY_PATH.get(path)


def describe() -> str:
    """The POST paths as a client reads them, with how a gateway places each route."""
    return ", ".join(f"{' | '.join(r.paths)} ({_PLACED[r.placement]})" for r in ROUTES)


_PLACED: dict[Placement, str] = {"split": "split per input", "whole": "whole"}
_TASK_MODEL: dict[str, str] = {
    "embed": "an embedding model",
    "rerank": "a reranker",
    "classify": "a classifier",
}


def wrong_task(model: str, task: str) -> str:
    """What a route says when the model's task is `task`, not its own: where to go instead."""
    what = _TASK_MODEL.get(task, f"a {task!r} model")
    where = next((f": POST {r.path}" for r in ROUTES if task in r.tasks), "")
    return f"model {model!r} is {what}{where}"
