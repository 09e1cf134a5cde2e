"""`POST /v1/embeddings` on the serving template (server/pipeline.py): the request's own parts.
The OpenAI body, plus compressed types (api/quantize.py) and the vector-space metadata; inputs
seen before come from the result cache when the server has one (server/result_cache.py)."""

from __future__ import annotations

from typing import Any

from embedserve.api.multimodal import resolve_items
from embedserve.api.protocol import ApiError, EmbeddingRequest, encode_vector, usage
from embedserve.api.quantize import quantize, to_base64
from embedserve.api.routes import EMBEDDINGS
from embedserve.api.sparse import sparse_item
from embedserve.engine.outputs import EmbeddingOutput
from embedserve.server.pipeline import Computed, Job, ServerRoute
from embedserve.server.serving import EmbeddingService
from embedserve.tokenizer import Tokenized


class EmbeddingsJob(Job):
    def __init__(self, svc: EmbeddingService, req: EmbeddingRequest) -> None:
        super().__init__(req.model, len(req.items))
        self.svc = svc
        self.req = req

    def tokenize(self) -> list[Tokenized]:
        svc, req = self.svc, self.req
        check_sparse_options(req)
        svc.engine.check_dimensions(req.dimensions)
        svc.check_types([req.embedding_type], req.dimensions)
        prompt = svc.engine.resolve_prompt(req.prompt_name, req.prompt)
        return svc.engine.tokenize(resolve_items(req.items), prompt, req.truncate)

    async def run(self, tokenized: list[Tokenized]) -> list[EmbeddingOutput]:
        cache = self.svc.result_cache
        if cache is None:
            return await self._compute(tokenized)
        schema = self.svc.metadata.schema(self.req.dimensions, self.req.normalize)
        return await cache.through(schema, tokenized, self._compute)

    async def _compute(self, tokenized: list[Tokenized]) -> list[EmbeddingOutput]:
        # The records carry the ids with prompt and truncation applied, and the prompt's
        # length for pooling that excludes it: the engine does not tokenize again.
        req = self.req
        return await self.svc.engine.embed_tokenized_async(
            tokenized, dimensions=req.dimensions, normalize=req.normalize, priority=req.priority
        )

    def body(self, done: Computed) -> Any:
        req, svc = self.req, self.svc
        kind = req.embedding_type
        vectors: list[Any]
        if kind == "sparse":
            token = svc.engine.tokenizer.backend.id_to_token if req.return_tokens else None
            vectors = [sparse_item(o.embedding, req.sparse_top_k, token) for o in done.outputs]
        elif kind == "float":
            vectors = [encode_vector(o.embedding, req.encoding_format) for o in done.outputs]
        else:  # compressed (extension): ints, or their raw bytes in base64
            q = quantize(done.matrix(), kind, svc.calibration)
            vectors = [to_base64(v) if req.encoding_format == "base64" else v.tolist() for v in q]
        data = [
            {
                "object": "embedding",
                "index": i,
                "embedding": vec,
                "num_tokens": out.num_tokens,
                "truncated": tok.truncated,
            }
            for i, (vec, out, tok) in enumerate(zip(vectors, done.outputs, done.tokenized, strict=True))
        ]
        n = done.n_tokens
        return {
            "object": "list",
            "data": data,
            "usage": usage(n),
            **svc.metadata.fields(req.dimensions, req.normalize, svc.schema_type(kind)),
        }


def check_sparse_options(req: EmbeddingRequest) -> None:
    """The sparse options go with `embedding_type: sparse` only. A sparse vector is JSON (indices
    and values) whatever `encoding_format` says: the openai client asks for base64 by default and
    passes an answer that is not a base64 string through unchanged."""
    if req.embedding_type == "sparse":
        return
    given = [f for f in ("sparse_top_k", "return_tokens") if f in req.model_fields_set]
    if given:
        raise ApiError(400, f"{', '.join(given)} applies to embedding_type 'sparse' only")


EMBEDDINGS_ROUTE = ServerRoute(EMBEDDINGS, EmbeddingsJob)
