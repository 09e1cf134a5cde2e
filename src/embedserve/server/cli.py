"""`embedserve serve`: the OpenAI-compatible embedding server on uvicorn."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from embedserve.api.keepalive import KEEP_ALIVE_S, MAX_RETRY_AFTER_S
from embedserve.batch.settings import add_batch_options
from embedserve.batch.settings import from_args as batch_settings
from embedserve.engine.options import EngineOptions, add_engine_options, positive_int
from embedserve.tracing import add_tracing_options
from embedserve.tracing import from_args as tracing_settings

if TYPE_CHECKING:
    from embedserve.server.runtime import ServerSettings

API_KEY_ENV = "EMBEDSERVE_API_KEY"


def _lengths(text: str) -> tuple[int, ...]:
    return tuple(positive_int(x.strip()) for x in text.split(",") if x.strip())


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected seconds > 0, got {text!r}")
    return value


class _DefaultsFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows defaults, except None and those the help text already explains."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.default is None or "default" in text:
            return text
        return super()._get_help_string(action) or text


def register(sub: Any) -> None:
    p = sub.add_parser(
        "serve",
        help="serve embeddings over HTTP (OpenAI-compatible /v1/embeddings; Cohere /v2/embed; /v1/rerank)",
        description=__doc__,
        formatter_class=_DefaultsFormatter,
    )
    add_engine_options(p)
    g = p.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1", help="interface to bind")
    g.add_argument("--port", type=int, default=8000, help="TCP port to bind")
    g.add_argument(
        "--served-model-name",
        default=None,
        help="model name clients pass and responses report (default: the model directory's name)",
    )
    g.add_argument(
        "--model-version",
        default=None,
        help="version label in vector metadata (default: a fingerprint of the model files)",
    )
    g.add_argument(
        "--api-key",
        action="append",
        default=None,
        help=f"require 'Authorization: Bearer KEY' (repeatable; or comma-separated in ${API_KEY_ENV}); "
        "health endpoints stay open",
    )
    g.add_argument(
        "--max-queued-tokens",
        type=positive_int,
        default=None,
        help="tokens admitted and not yet answered before new requests get 429 "
        "(default: max(4 x max_model_len, 32 x max_num_batched_tokens))",
    )
    g.add_argument(
        "--max-queued-requests",
        type=positive_int,
        default=4096,
        help="inputs (each item of a batch counts) admitted and not yet answered before 429",
    )
    g.add_argument(
        "--max-inputs-per-request",
        type=positive_int,
        default=2048,
        help="most inputs in one request (more: 400)",
    )
    g.add_argument(
        "--max-output-vectors",
        type=positive_int,
        default=32768,
        help="most vectors in one multi-vector answer, all inputs together (more: 413)",
    )
    g.add_argument(
        "--max-body-bytes",
        type=positive_int,
        default=32 << 20,
        help="largest request body in bytes (more: 413)",
    )
    h = p.add_argument_group("limits on slow and hostile clients, and on faults")
    h.add_argument(
        "--body-timeout", type=_seconds, default=30.0, help="seconds for a whole request body (more: 408)"
    )
    h.add_argument(
        "--request-timeout",
        type=_seconds,
        default=300.0,
        help="seconds a request may wait in the queue and run (a caller's X-Request-Timeout header "
        "can only shorten it); then its work is cancelled and it gets 503 + Retry-After with error "
        "type deadline_exceeded, which a gateway answers at once rather than retrying another pool",
    )
    h.add_argument(
        "--timeout-keep-alive",
        type=_seconds,
        default=KEEP_ALIVE_S,
        help=f"seconds before an idle keep-alive connection is closed (default: {KEEP_ALIVE_S:g}); keep "
        "it above the clients' own idle expiry (httpx: 5 s) and the longest Retry-After "
        f"({MAX_RETRY_AFTER_S} s), else a request sent as the server closes the connection gets no "
        "answer; idle connections count towards --limit-concurrency",
    )
    h.add_argument(
        "--limit-concurrency",
        type=positive_int,
        default=1024,
        help="open connections plus running requests beyond which uvicorn answers 503",
    )
    h.add_argument(
        "--max-engine-restarts",
        type=int,
        default=3,
        help="times the engine is rebuilt in-process after its loop dies (503 + Retry-After "
        "meanwhile) before the server exits 1",
    )
    g.add_argument(
        "--warmup-lengths",
        type=_lengths,
        default=None,
        help="comma-separated input lengths (tokens) to warm up before ready (default: 16,512, capped "
        "at max_model_len); one step filling max_num_batched_tokens always runs too",
    )
    g.add_argument(
        "--int8-calibration",
        default=None,
        metavar="NPY",
        help="int8/uint8 outputs: per-dimension ranges from this .npy ([2, dim] min/max rows, or [n, dim] "
        "calibration embeddings)",
    )
    g.add_argument(
        "--int8-scale",
        type=float,
        default=1.0,
        help="int8/uint8 outputs without --int8-calibration: the fixed range [-scale, scale] per dimension",
    )
    g.add_argument(
        "--result-cache-entries",
        type=int,
        default=0,
        metavar="N",
        help="answer repeated inputs of /v1/embeddings, /v2/embed and /embed from an LRU of N vectors "
        "(0, the default: off); a hit is byte-identical to a recompute under --deterministic, else the "
        "first computation's vector (batch-dependent rounding apart); memory about N * (dim * 4 + 200) "
        "bytes; metrics embedserve_result_cache_*",
    )
    g.add_argument(
        "--log-level", default="info", choices=["debug", "info", "warning", "error"], help="log verbosity"
    )
    add_tracing_options(p.add_argument_group("tracing (OpenTelemetry; docs/tracing.md)"))
    add_batch_options(p)
    p.set_defaults(func=_cmd_serve)


def _api_keys(args: argparse.Namespace) -> tuple[str, ...]:
    keys = list(args.api_key or [])
    keys += os.environ.get(API_KEY_ENV, "").split(",")
    return tuple(k.strip() for k in keys if k.strip())


def _cmd_serve(args: argparse.Namespace) -> int:
    from embedserve.server.launch import serve

    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        settings = _settings(args)
    except ValueError as e:
        print(f"embedserve serve: error: {e}", file=sys.stderr)
        return 2
    return serve(settings, args.host, args.port, args.log_level)


def _settings(args: argparse.Namespace) -> ServerSettings:
    from embedserve.server.runtime import ServerSettings

    return ServerSettings(
        model=args.model,
        engine=EngineOptions.from_args(args),
        served_model_name=args.served_model_name or _default_model_name(args.model),
        model_version=args.model_version,
        api_keys=_api_keys(args),
        max_queued_tokens=args.max_queued_tokens,
        max_queued_requests=args.max_queued_requests,
        max_inputs_per_request=args.max_inputs_per_request,
        max_output_vectors=args.max_output_vectors,
        max_body_bytes=args.max_body_bytes,
        warmup_lengths=args.warmup_lengths,
        body_timeout_s=args.body_timeout,
        request_timeout_s=args.request_timeout,
        timeout_keep_alive_s=args.timeout_keep_alive,
        limit_concurrency=args.limit_concurrency,
        max_engine_restarts=args.max_engine_restarts,
        int8_calibration=args.int8_calibration,
        int8_scale=args.int8_scale,
        tracing=tracing_settings(args),
        result_cache_entries=args.result_cache_entries,
        batch=batch_settings(args),
    )


def _default_model_name(model: str) -> str | None:
    """The bundled default model is served under its model name, not its folder's ("model")."""
    from embedserve.errors import ModelLoadError
    from embedserve.models.default import DEFAULT_MODEL_NAME, default_model_path

    try:
        is_default = Path(model).resolve() == default_model_path().resolve()
    except ModelLoadError:  # the default model is not installed: nothing to compare with
        return None
    return DEFAULT_MODEL_NAME if is_default else None
