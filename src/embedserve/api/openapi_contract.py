"""`/openapi.json` as the contract of one served model: the generic document (every route, every
shape) narrowed, once the model is loaded, to what that model accepts, so that a request the
document allows is one the server answers with a 2xx (and one it forbids, a 4xx):

    routes            only those of the model's task, and of an output it emits (/embed_sparse:
                      a sparse model; /embed, /similarity, /embed_all, /pooling, /v1/score:
                      dense vectors);
                      TEI's `/` and `/invocations` list the bodies they route
    prompt_name       one of the model's prompt names (null only, for a model without prompts)
    token ids         below the model's vocabulary size (`TokenId` schemas)
    dimensions        at most the model's width (`dimensions`, Cohere's `output_dimension`)
    embedding_type    sparse / multivector only for a model that emits them, float and the
                      compressed types for one with dense vectors (else required; Cohere's too)
    image parts       only for a multimodal model
    /v1/score         raw_scores and instruction only for a reranker, prompts only for an embedder
    /v1/rerank        a reranker's, or MaxSim on a multi-vector model (no instruction, raw_scores)

What JSON Schema cannot say stays in the route's description and answers 400: an input's token
count against max_model_len, `/v1/score`'s equal list lengths. A gateway serving several models
narrows to what any of them accepts (`ModelFacts.union`).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from embedserve.api.dispatch import DISPATCHES
from embedserve.api.routes import ROUTES, Route

TOKEN_ID = "TokenId"  # the title of every token-id schema
IMAGE = "ImagePart"  # the title of the image part's schema (api/openapi_multimodal.py)
_DIMENSIONS = ("dimensions", "output_dimension")
_OPTIONAL_OUTPUTS = ("sparse", "multivector")  # embedding_type values only some models emit


@dataclass(frozen=True)
class ModelFacts:
    """What a served model accepts, from its `/v1/models` card."""

    tasks: frozenset[str]
    outputs: frozenset[str]  # dense, sparse, multivector, images
    prompts: frozenset[str]
    vocab_size: int
    dimensions: int

    @classmethod
    def of_card(cls, card: Mapping[str, Any], task: str, vocab_size: int) -> ModelFacts:
        return cls(
            tasks=frozenset({task}),
            outputs=frozenset(card.get("outputs") or ("dense",)),
            prompts=frozenset(card.get("prompt_names") or ()),
            vocab_size=vocab_size,
            dimensions=int(card["dimensions"]),
        )

    @classmethod
    def union(cls, facts: Iterable[ModelFacts]) -> ModelFacts:
        """What any of several models accepts (a gateway's document)."""
        every = list(facts)
        return cls(
            tasks=frozenset().union(*(f.tasks for f in every)),
            outputs=frozenset().union(*(f.outputs for f in every)),
            prompts=frozenset().union(*(f.prompts for f in every)),
            vocab_size=max(f.vocab_size for f in every),
            dimensions=max(f.dimensions for f in every),
        )

    def serves(self, route: Route[Any]) -> bool:
        if route.also is not None and route.also in self.outputs:
            return True
        return bool(self.tasks & set(route.tasks)) and (route.output is None or route.output in self.outputs)


def served_document(doc: dict[str, Any], facts: ModelFacts, max_inputs: int) -> dict[str, Any]:
    """`doc` (the app's generic document) narrowed to `facts`; `doc` itself is not changed."""
    out = copy.deepcopy(doc)
    paths: dict[str, Any] = out.get("paths", {})
    for route in ROUTES:
        if not facts.serves(route):
            for path in route.paths:
                paths.get(path, {}).pop("post", None)
    for dispatch in DISPATCHES:
        operation = paths.get(dispatch.path, {}).get("post")
        kept = tuple(r for r in dispatch.routes(facts.tasks) if facts.serves(r))
        if operation is not None and not kept:  # e.g. TEI's / for a model without dense vectors
            paths[dispatch.path].pop("post")
        elif operation is not None:
            operation["requestBody"] = dispatch.doc(max_inputs, (), kept)["openapi_extra"]["requestBody"]
    for path in [p for p, ops in paths.items() if not ops]:
        del paths[path]
    for ops in paths.values():
        for operation in ops.values():
            content = operation.get("requestBody", {}).get("content", {})
            for media in content.values():
                if "schema" in media:
                    media["schema"] = _narrow(media["schema"], facts)
    return out


def _narrow(node: Any, facts: ModelFacts) -> Any:
    if isinstance(node, list):
        return [_narrow(x, facts) for x in node if not (_is_image(x) and "images" not in facts.outputs)]
    if not isinstance(node, dict):
        return node
    node = {k: _narrow(v, facts) for k, v in node.items()}
    if node.get("title") == TOKEN_ID:
        node["maximum"] = facts.vocab_size - 1
    props = node.get("properties")
    # a request model's own fields only: a property inside `not` or a rule's branch (an `if`, a
    # dependent schema) states a condition, which a narrowed copy would change
    title = str(node.get("title", ""))
    if isinstance(props, dict) and title.endswith("Request"):
        if "prompt_name" in props:
            names = sorted(facts.prompts)
            props["prompt_name"] = (
                {"anyOf": [{"enum": names}, {"type": "null"}]} if names else {"type": "null"}
            )
        for name in _DIMENSIONS:
            if name in props:
                # a SPLADE model's vectors have no width to cut
                dense = "dense" in facts.outputs
                props[name] = _capped(props[name], facts.dimensions) if dense else {"type": "null"}
        for name in ("embedding_type", "embedding_types"):
            if name in props:
                props[name] = _outputs_only(props[name], facts.outputs)
                if "dense" not in facts.outputs:  # the default (float) is not this model's
                    node["required"] = sorted({*node.get("required", []), name})
        if title in ("ScoreRequest", "RerankRequest", "TeiRerankRequest") and "rerank" not in facts.tasks:
            _only(props, raw_scores={"enum": [False]}, instruction={"type": "null"})  # a reranker's options:
            # an embedding model's score is a cosine, its rerank MaxSim
        if title == "ScoreRequest" and "embed" not in facts.tasks:
            _only(
                props, prompt_name={"type": "null"}, prompt={"type": "null"}
            )  # a reranker takes instruction
        if title == "TokenizeRequest" and "images" in facts.outputs:
            props["add_special_tokens"] = {"enum": [True]}  # a multimodal model counts its template
    return node


def _only(props: dict[str, Any], **schemas: Any) -> None:
    """Each of `props`' properties named in `schemas` narrowed to it (absent ones stay absent)."""
    props.update({k: v for k, v in schemas.items() if k in props})


def _is_image(node: Any) -> bool:
    return isinstance(node, dict) and node.get("title") == IMAGE


def _capped(node: Any, most: int) -> Any:
    """Every integer schema in `node` at most `most`."""
    if isinstance(node, dict):
        node = {k: _capped(v, most) for k, v in node.items()}
        if node.get("type") == "integer":
            node["maximum"] = most
    elif isinstance(node, list):
        node = [_capped(x, most) for x in node]
    return node


def _outputs_only(node: Any, outputs: frozenset[str]) -> Any:
    """`enum` lists in `node` without the embedding types the model does not emit (float and the
    compressed types are its dense vectors')."""

    def emitted(kind: Any) -> bool:
        return kind in outputs if kind in _OPTIONAL_OUTPUTS else "dense" in outputs

    if isinstance(node, dict):
        node = {k: _outputs_only(v, outputs) for k, v in node.items()}
        if isinstance(node.get("enum"), list):
            node["enum"] = [v for v in node["enum"] if emitted(v)]
            if not node["enum"]:
                node = {"not": {}}  # no value of it is accepted
        elif "const" in node and not emitted(node["const"]):
            node = {"not": {}}
    elif isinstance(node, list):
        node = [_outputs_only(x, outputs) for x in node]
    return node


def served_openapi(
    generic: Callable[[], dict[str, Any]], facts: Callable[[], ModelFacts | None], max_inputs: int
) -> Callable[[], dict[str, Any]]:
    """An app's `openapi()`: the generic document until `facts()` knows the served model(s), then
    that document narrowed to them (made again when they change: a gateway's reload)."""
    made: dict[ModelFacts, dict[str, Any]] = {}

    def openapi() -> dict[str, Any]:
        known = facts()
        if known is None:
            return generic()
        doc = made.get(known)
        if doc is None:
            doc = served_document(generic(), known, max_inputs)
            made.clear()
            made[known] = doc
        return doc

    return openapi
