"""LoRA adapters loaded and unloaded while the server runs, on vLLM's routes and bodies:
`POST /v1/load_lora_adapter {"lora_name", "lora_path"}` and `POST /v1/unload_lora_adapter
{"lora_name"}` (answered in vLLM's plain-text words). They read directories on the server's
disk, so they exist only on a server that requires an API key (--api-key): without one they
answer 403 saying so. An adapter unloaded while its requests run finishes them with its weights.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse
from pydantic import BaseModel, ConfigDict, Field

from embedserve.api.http import read_body
from embedserve.api.protocol import ApiError, parse_body
from embedserve.api.refusals import model_not_found
from embedserve.engine.adapters import Adapters, UnknownAdapterError
from embedserve.errors import ModelLoadError
from embedserve.server.serving import EmbeddingService

_MAX_BODY = 64 << 10


class LoadLoraAdapter(BaseModel):
    model_config = ConfigDict(extra="forbid")
    lora_name: str = Field(min_length=1, max_length=128, description="the name requests' `model` field uses")
    lora_path: str = Field(min_length=1, description="a PEFT adapter directory on the server's disk")
    lora_int_id: int | None = Field(None, description="accepted for vLLM's clients; not used")
    load_inplace: bool = Field(False, description="replace an adapter loaded under this name")


class UnloadLoraAdapter(BaseModel):
    model_config = ConfigDict(extra="forbid")
    lora_name: str = Field(min_length=1, max_length=128)
    lora_int_id: int | None = Field(None, description="accepted for vLLM's clients; not used")


def add_lora_routes(
    app: FastAPI, service: Callable[[], EmbeddingService], keyed: bool, dependencies: list[Any]
) -> None:
    """The two admin routes; `keyed`: the server requires an API key (else they answer 403)."""
    responses: dict[int | str, dict[str, Any]] = {
        200: {"content": {"text/plain": {}}, "description": "done"},
        **{code: {"description": why} for code, why in _ERRORS.items()},
    }

    @app.post("/v1/load_lora_adapter", dependencies=dependencies, responses=responses)
    async def load(request: Request) -> PlainTextResponse:
        svc, body = _admin(service, keyed), parse_body(LoadLoraAdapter, await read_body(request, _MAX_BODY))
        adapters = _adapters(svc)
        name = body.lora_name
        if name == svc.metadata.model:
            raise ApiError(400, f"{name!r} is the base model's name: an adapter needs another")
        try:
            if body.load_inplace and name in svc.served_names():
                await asyncio.to_thread(adapters.replace, name, body.lora_path)
            else:
                await asyncio.to_thread(adapters.load, name, body.lora_path)
        except ModelLoadError as e:
            raise ApiError(400, str(e)) from None
        return PlainTextResponse(f"Success: LoRA adapter '{name}' added successfully.")

    @app.post("/v1/unload_lora_adapter", dependencies=dependencies, responses=responses)
    async def unload(request: Request) -> PlainTextResponse:
        svc, body = _admin(service, keyed), parse_body(UnloadLoraAdapter, await read_body(request, _MAX_BODY))
        try:
            _adapters(svc).unload(body.lora_name)
        except UnknownAdapterError:
            raise model_not_found(body.lora_name, ", ".join(svc.served_names())) from None
        return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' removed successfully.")


_ERRORS = {
    400: "not an adapter this server can load, or a malformed body",
    401: "missing or wrong API key",
    403: "the server requires no API key, so it loads no adapter at run time",
    404: "no adapter of that name is loaded",
    503: "not ready",
}


def _admin(service: Callable[[], EmbeddingService], keyed: bool) -> EmbeddingService:
    if not keyed:
        raise ApiError(
            403,
            "adapters are loaded at run time only on a server that requires an API key (--api-key): "
            "these routes read directories on its disk. Without one, name them at start (--lora-modules)",
            "permission_error",
        )
    return service()


def _adapters(svc: EmbeddingService) -> Adapters:
    adapters = svc.engine.adapters
    if adapters is None or adapters.merged is not None:
        why = (
            "was started without --enable-lora"
            if adapters is None
            else "serves a merged adapter (--merge-lora)"
        )
        raise ApiError(400, f"this server {why}: it loads no adapter")
    return adapters
