"""`POST /v1/embeddings` on the serving template (server/pipeline.py): the request's own parts.
The OpenAI body, plus compressed types (api/quantize.py) and the vector-space metadata; inputs
seen before come from the result cache when the server has one (server/result_cache.py)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from embedserve.api.multimodal import resolve_items
from embedserve.api.protocol import ApiError, EmbeddingRequest, encode_vector, usage
from embedserve.api.quantize import encode_values, quantize
from embedserve.api.routes import EMBEDDINGS
from embedserve.api.sparse import sparse_item
from embedserve.engine.ask import Ask, LateChunking, Prepared, answers_as
from embedserve.engine.late import join_windows
from embedserve.engine.outputs import EmbeddingOutput
from embedserve.pooling.outputs import Output, multivectors_only
from embedserve.schema import MULTIVECTOR
from embedserve.server.multivector_routes import MultiVectorJob
from embedserve.server.pipeline import Computed, Job, ServerRoute
from embedserve.server.serving import EmbeddingService
from embedserve.tokenizer import Tokenized
from embedserve.tokenizer.windows import LongPlan


class EmbeddingsJob(Job):
    def __init__(self, svc: EmbeddingService, req: EmbeddingRequest) -> None:
        # late chunking: the limit counts chunks (vectors), known after tokenizing for a size
        super().__init__(req.model, req.n_outputs or 1)
        self.svc = svc
        self.req = req
        self.plan: LongPlan | None = None  # late chunking: the document's window requests
        self.ask = Ask()  # what each prepared sequence asks (a late document's windows: DENSE)

    def tokenize(self) -> list[Tokenized]:
        svc, req = self.svc, self.req
        check_sparse_options(req)
        if multivectors_only(svc.engine.outputs):
            raise ApiError(
                400,
                f"model {svc.metadata.model} is a multi-vector (late-interaction) model: it answers "
                "embedding_type 'multivector' (a vector per token), not one vector per input",
            )
        render = svc.engine.renderer
        render.check_dimensions(req.dimensions)
        svc.check_types([req.embedding_type], req.dimensions)
        lexical = req.embedding_type == Output.SPARSE.value and Output.LEXICAL in svc.engine.outputs
        ask = Ask(
            Output.LEXICAL if lexical else Output.SPANS if req.late_chunking else Output.DENSE,
            req.prompt_name, req.prompt, req.dimensions, req.normalize, req.priority, req.truncate,
        )  # fmt: skip
        if req.late_chunking:
            prepared = svc.engine.prepare(req.input, replace(ask, late=LateChunking.of_request(req)))
            self.plan = prepared.plan
            assert self.plan is not None
            limit, n = svc.max_inputs_per_request, len(self.plan.spans)
            if n > limit:
                raise ApiError(
                    400, f"the document has {n} chunks: one request answers at most {limit} vectors"
                )
            # windows' raw rows run without the head, which applies once they are joined
            self.ask = (
                replace(ask, output=Output.DENSE, dimensions=None, normalize=False)
                if self.plan.raw
                else replace(ask, output=Output.DENSE)
            )
            return prepared.tokenized
        self.ask = ask
        return svc.engine.prepare(resolve_items(req.items), ask).tokenized

    async def run(self, tokenized: list[Tokenized]) -> list[EmbeddingOutput]:
        cache = self.svc.result_cache
        if cache is None:
            return await self._compute(tokenized)
        sparse = self.req.embedding_type == Output.SPARSE.value  # BGE-M3 serves both
        kind = Output.SPARSE.value if sparse else "float"
        schema = self.svc.metadata.schema(self.req.dimensions, self._normalize(), kind)
        return await cache.through(schema, tokenized, self._compute)

    async def _compute(self, tokenized: list[Tokenized]) -> list[EmbeddingOutput]:
        # The records carry the ids with prompt and truncation applied, and the prompt's
        # length for pooling that excludes it: the engine does not tokenize again.
        answers = await self.svc.engine.run_async(Prepared(self.ask, tokenized))
        return answers_as(answers, EmbeddingOutput)

    def _normalize(self) -> bool | None:
        """The request's normalize as its vectors' schema records it: BGE-M3's sparse vectors are
        unnormalized unless asked (the model's default is its dense vectors')."""
        lexical = self.req.embedding_type == Output.SPARSE.value and Output.LEXICAL in self.svc.engine.outputs
        return bool(self.req.normalize) if lexical else self.req.normalize

    def body(self, done: Computed) -> Any:
        req, svc = self.req, self.svc
        kind = req.embedding_type
        late: dict[str, Any] = {}
        rows: np.ndarray | list[np.ndarray]
        if self.plan is not None:
            normalize = svc.metadata.default_normalize if req.normalize is None else req.normalize
            rows = join_windows(self.plan, [o.embedding for o in done.outputs], req.dimensions, normalize)
            items = late_items(self.plan)
            late = {"late_chunking": late_summary(self.plan)}
        else:
            rows = [o.embedding for o in done.outputs]  # not one matrix: a SPLADE row is vocabulary-wide
            items = [
                {"index": i, "num_tokens": out.num_tokens, "truncated": tok.truncated}
                for i, (out, tok) in enumerate(zip(done.outputs, done.tokenized, strict=True))
            ]
        vectors: list[Any]
        if kind == Output.SPARSE.value:
            token = svc.engine.tokenizer.backend.id_to_token if req.return_tokens else None
            vectors = [sparse_item(row, req.sparse_top_k, token) for row in rows]
        elif kind == "float":
            vectors = [encode_vector(row, req.encoding_format) for row in rows]
        else:  # compressed (extension)
            q = quantize(np.asarray(rows), kind, svc.calibration)
            vectors = [encode_values(v, req.encoding_format) for v in q]
        data = [
            {"object": "embedding", "index": item.pop("index"), "embedding": vec, **item}
            for vec, item in zip(vectors, items, strict=True)
        ]
        span_pooling = (
            None
            if self.plan is None
            else late_schema_key(self.plan, req.span_pooling, req.long_late_chunking)
        )
        return {
            "object": "list",
            "data": data,
            "usage": usage(done.n_tokens),
            **svc.metadata.fields(req.dimensions, self._normalize(), svc.schema_type(kind), span_pooling),
            **late,
        }


def late_items(plan: LongPlan) -> list[dict[str, Any]]:
    """One item per chunk of a late-chunked document: its index in the request, its own
    tokens, its character and token ranges; chunks truncation cut off have none."""
    return [
        {
            "index": c.index,
            "num_tokens": c.tokens[1] - c.tokens[0],
            "truncated": plan.document.truncated,
            "char_range": list(c.chars),
            "token_range": list(c.tokens),
        }
        for c in plan.spans
    ]


def late_schema_key(plan: LongPlan, span_pooling: str, long: bool) -> str:
    """What a late-chunked vector's schema records: its span pooling, and for long documents
    the window layout (max_model_len and overlap: a chunk's vector depends on them)."""
    if not long:
        return span_pooling
    return f"{span_pooling};windows={plan.max_len}/{plan.overlap}"


def late_summary(plan: LongPlan) -> dict[str, int]:
    """What a late-chunked answer says of its document: its tokens, and the windows it ran as
    (more than one with long_late_chunking; `usage` counts every window's tokens)."""
    return {
        "num_tokens": len(plan.document.token_ids),
        "windows": len(plan.windows),
        "overlap_tokens": plan.overlap_tokens,
    }


def check_sparse_options(req: EmbeddingRequest) -> None:
    """The sparse options go with `embedding_type: sparse` only. A sparse vector is JSON (indices
    and values) whatever `encoding_format` says: the openai client asks for base64 by default and
    passes an answer that is not a base64 string through unchanged."""
    if req.embedding_type == Output.SPARSE.value:
        return
    given = [f for f in ("sparse_top_k", "return_tokens") if f in req.model_fields_set]
    if given:
        raise ApiError(400, f"{', '.join(given)} applies to embedding_type 'sparse' only")


def embeddings_job(svc: EmbeddingService, req: EmbeddingRequest) -> Job:
    """Multi-vector requests have their own job (server/multivector_routes.py)."""
    return MultiVectorJob(svc, req) if req.embedding_type == MULTIVECTOR else EmbeddingsJob(svc, req)


EMBEDDINGS_ROUTE = ServerRoute(EMBEDDINGS, embeddings_job)
