"""`POST /v2/embed` (Cohere's embed API) on the serving template: the work of `/v1/embeddings`
(prompt from `input_type`, truncation: `CohereEmbedRequest.to_embedding_request`), the vectors
in every requested type with a schema per type; the shapes are in api/cohere.py.

`"multivector"` (ours): a ColBERT model's token vectors (that type alone; `search_query` is its
query side), or BGE-M3's beside its dense and sparse vectors, all from one pass."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from embedserve.api.cohere import CohereEmbedRequest, cohere_body, embeddings_by_type, quantized_type
from embedserve.api.protocol import ApiError
from embedserve.api.routes import COHERE_EMBED
from embedserve.engine.ask import Ask, Prepared, answers_as
from embedserve.engine.lexical import OnePassOutput
from embedserve.engine.outputs import EmbeddingOutput
from embedserve.errors import COHERE_REMEDY
from embedserve.pooling.outputs import Output, multivectors_only
from embedserve.schema import MULTIVECTOR, multivector_type
from embedserve.server.embeddings_routes import EmbeddingsJob
from embedserve.server.multivector_routes import check_vector_count
from embedserve.server.pipeline import Computed, ServerRoute
from embedserve.server.serving import EmbeddingService
from embedserve.tokenizer import Tokenized


class CohereEmbedJob(EmbeddingsJob):
    @property
    def truncate_remedy(self) -> str:
        return COHERE_REMEDY

    def __init__(self, svc: EmbeddingService, req: CohereEmbedRequest) -> None:
        super().__init__(svc, req.to_embedding_request(svc.engine.config.prompts))
        self.cohere = req
        self.lexical: np.ndarray | None = None
        self.multivector: list[np.ndarray] | None = None
        self.tokens: Prepared | None = None  # a ColBERT model's inputs

    def tokenize(self) -> list[Tokenized]:
        req, engine = self.cohere, self.svc.engine
        kinds = [quantized_type(k) for k in req.embedding_types]
        self.multi = MULTIVECTOR in kinds
        head = engine.multivector_head
        if self.multi and Output.MULTIVECTOR not in engine.outputs:
            raise ApiError(
                400,
                f"model {self.svc.metadata.model} gives one vector per input: embedding_types "
                "'multivector' needs a multi-vector model (ColBERT, BGE-M3 with colbert_linear.pt)",
            )
        # ColBERT (or only BGE-M3's token vectors asked): the token vectors, on the input type's side
        only = multivectors_only(engine.outputs) or (self.multi and set(kinds) == {MULTIVECTOR})
        if only:
            if set(kinds) != {MULTIVECTOR}:
                raise ApiError(
                    400, f"model {self.svc.metadata.model} answers embedding_types ['multivector'] only"
                )
            side = "query" if req.input_type == "search_query" else "document"
            ask = Ask(Output.MULTIVECTOR, dimensions=req.output_dimension, truncate=self.req.truncate)
            self.tokens = engine.prepare(list(req.texts), replace(ask, side=side, priority=self.req.priority))
            engine.renderer.check_vector_dimensions(req.output_dimension)
            check_vector_count(self.svc, sum(i.num_vectors for i in self.tokens.sides or []))
            return self.tokens.tokenized
        others = [k for k in kinds if k != MULTIVECTOR]
        self.svc.check_types(others or ["float"], req.output_dimension, one_pass=True)
        # BGE-M3: dense and sparse (and its token vectors), one pass
        self.both = (Output.SPARSE.value in kinds and len(set(kinds)) > 1) or self.multi
        if self.both:  # the sparse side's checks; the dense side's dimensions apply
            tokenized = engine.renderer.text(list(req.texts), self.prompt(), self.req.truncate)
            if self.multi:
                assert head is not None
                check_vector_count(self.svc, sum(sum(head.keeps(t.token_ids, "document")) for t in tokenized))
            return tokenized
        return super().tokenize()

    def prompt(self) -> str:
        return self.svc.engine.renderer.prompt(self.req.prompt_name, self.req.prompt)

    async def run(self, tokenized: list[Tokenized]) -> list[EmbeddingOutput]:
        req, engine = self.cohere, self.svc.engine
        if self.tokens is not None:
            out = answers_as(await engine.run_async(self.tokens), EmbeddingOutput)
            self.multivector = [o.embedding for o in out]
            return out
        if not self.both:
            return await super().run(tokenized)
        extras = frozenset({Output.LEXICAL, Output.MULTIVECTOR} if self.multi else {Output.LEXICAL})
        ask = Ask(dimensions=req.output_dimension, priority=self.req.priority, extras=extras)
        one = answers_as(await engine.run_async(Prepared(ask, tokenized)), OnePassOutput)
        self.lexical = np.stack([o.lexical for o in one])
        self.multivector = [o.multivector for o in one if o.multivector is not None] if self.multi else None
        return [replace(o.output, embedding=o.dense) for o in one]

    def body(self, done: Computed) -> dict[str, Any]:
        req, svc = self.cohere, self.svc
        meta = svc.metadata
        render = svc.engine.renderer  # a multi-vector model's token width and normalization
        token_norm = render.token_head().normalize if Output.MULTIVECTOR in svc.engine.outputs else None
        width = req.output_dimension or render.spec.token_dim
        schemas = {
            k: meta.schema(width, token_norm, multivector_type("float"))
            if k == MULTIVECTOR
            else meta.schema(req.output_dimension, None, svc.schema_type(quantized_type(k)))
            for k in req.embedding_types
        }
        splade = Output.SPARSE in svc.engine.outputs
        kind = Output.SPARSE.value if splade else "float"  # a SPLADE model's: sparse
        if self.tokens is not None:
            kind = multivector_type("float")
        dimension = width if self.tokens is not None else req.output_dimension
        normalize = token_norm if self.tokens is not None else None
        metadata = {**meta.fields(dimension, normalize, kind), "embedding_schemas": schemas}
        dense = None if self.tokens is not None else done.matrix()
        kinds: list[str] = list(req.embedding_types)
        vectors = embeddings_by_type(dense, kinds, svc.calibration, self.lexical, self.multivector)
        return cohere_body(req, vectors, done.n_tokens, metadata)


COHERE_EMBED_ROUTE = ServerRoute(COHERE_EMBED, CohereEmbedJob)
