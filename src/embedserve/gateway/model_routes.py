"""The gateway's model routes: `/v1/models` (every model whose pools answer, with its aliases),
`/v1/models/{id}` and TEI's `/info`. With tenants, a tenant's key sees the models it may use:
the list leaves the others out, asking for one of them by id is the 403 its requests get, and an
unknown model's 404 names only the tenant's."""

from __future__ import annotations

import time
from typing import Any

from fastapi import FastAPI, Request
from fastapi.params import Depends

from embedserve.api.openapi import ModelCard, ModelList, error_responses
from embedserve.api.openapi_contract import ModelFacts
from embedserve.api.protocol import ApiError
from embedserve.api.refusals import model_not_found
from embedserve.api.tei import TeiInfo, model_type
from embedserve.api.tei import info as tei_info
from embedserve.gateway.fleet import Fleet, cards
from embedserve.gateway.live import Live
from embedserve.gateway.service import GatewayService


def add_model_routes(
    app: FastAPI, state: Live, auth: list[Depends], keyed: tuple[int, ...], own_keys: tuple[str, ...]
) -> None:
    """`own_keys`: the gateway's own (they see every model)."""
    refused = (*keyed, *((403,) if state.tenants is not None else ()))

    listed: dict[int | str, dict[str, Any]] = {200: {"model": ModelList}, **error_responses(*keyed, 503)}

    @app.get("/v1/models", dependencies=auth, response_model=None, responses=listed)
    @app.get("/models", dependencies=auth, response_model=None, responses=listed)  # Infinity's path
    async def models(request: Request) -> dict[str, Any]:
        data = cards(state.fleet, model_card)
        tenants = state.tenants
        if tenants is not None:
            data = tenants.visible(request.headers, own_keys, data)
        return {"object": "list", "data": data}

    @app.get(
        "/v1/models/{model_id:path}",
        dependencies=auth,
        response_model=None,
        responses={200: {"model": ModelCard}, **error_responses(*refused, 404, 503)},
    )
    async def model(model_id: str, request: Request) -> dict[str, Any]:
        fleet = state.fleet
        tenant = state.tenant_of(request.headers, own_keys)
        served, _ = fleet.resolve(model_id, None if tenant is None else tenant.may_use)
        if tenant is not None:  # before the card: a 403, not a 503, while its pools start
            tenant.allow_model(fleet.names_of(model_id, served))
        card = model_card(served)
        if fleet.single and model_id != card["id"]:
            raise model_not_found(model_id, card["id"], "gateway")
        return {**card, "aliases": fleet.aliases_of(str(card["id"]))} if not fleet.single else card

    @app.get(
        "/info",
        dependencies=auth,
        response_model=None,
        responses={200: {"model": TeiInfo}, **error_responses(*refused, 503)},
    )
    async def info(request: Request) -> dict[str, Any]:
        """Text Embeddings Inference's model and limits (api/tei.py), as the gateway takes them:
        the first model's (a tenant's 403 where it may not use that one)."""
        service = state.fleet.default
        tenant = state.tenant_of(request.headers, own_keys)
        if tenant is not None:
            tenant.allow_model(state.fleet.names_of(None, service))
        card = model_card(service)
        kind = model_type(served_task(service), str(card.get("pooling", "")), service.counter.labels)
        budget = max(p["max_tokens"] for p in card["pools"].values())
        limit = service.config.max_inputs_per_request
        return tei_info(card, kind, budget, limit, service.config.max_inputs_per_request)


def fleet_facts(fleet: Fleet) -> ModelFacts | None:
    """What any served model accepts (`/openapi.json`), once each has a pool in rotation (its card)."""
    known = [(s, s.upstreams.model_card()) for s in fleet.services]
    if any(card is None for _, card in known):
        return None
    return ModelFacts.union(
        ModelFacts.of_card(card, served_task(s), s.counter.tokenizer.vocab_size) for s, card in known if card
    )


def served_task(service: GatewayService) -> str:
    """The model's task as its tokenizer's counter knows it: embed, rerank or classify."""
    return service.counter.spec.task


def model_card(service: GatewayService) -> dict[str, Any]:
    card = service.upstreams.model_card()
    if card is None:
        raise ApiError(503, "no upstream is in rotation yet", "service_unavailable", {"Retry-After": "1"})
    pools = service.upstreams.describe()
    return {
        **card,
        "id": service.model_name,
        "created": int(time.time()),
        "owned_by": "embedserve-gateway",
        # Inputs longer than this follow the request's truncate policy.
        "max_model_len": max(p["max_tokens"] for p in pools.values()),
        "embedding_schema": service.upstreams.schema,
        "pools": pools,
    }
