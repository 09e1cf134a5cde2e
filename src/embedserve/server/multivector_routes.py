"""`POST /v1/embeddings` with `"embedding_type": "multivector"`: one vector per kept token of each
input (ColBERT, BGE-M3's colbert head: engine/multivector.py).

Each item's `embedding` is its list of vectors, or with `encoding_format: "base64"` one
little-endian float32 blob of the whole [vectors, dim] matrix beside `"shape": [vectors, dim]`
(`base64_bytes`: the matrix's own bytes, one per value of a compressed type);
`multivector_dtype` compresses each vector (api/quantize.py: int8 / uint8 one byte per value,
binary / ubinary one bit, packed). `input_type` picks the side (query: expansion, no skiplist;
document: the skiplist). A request whose vectors would pass `--max-output-vectors` is refused
(413) after tokenizing, before any engine work: never cut silently.
"""

from __future__ import annotations

from typing import Any

from embedserve.api.multimodal import resolve_items
from embedserve.api.protocol import ApiError, EmbeddingRequest, usage
from embedserve.api.quantize import encode_values, quantize
from embedserve.engine.ask import Ask, answers_as
from embedserve.engine.outputs import EmbeddingOutput
from embedserve.models.multivector import MultiVectorHead
from embedserve.pooling.outputs import Output
from embedserve.schema import multivector_type
from embedserve.server.pipeline import Computed, Job
from embedserve.server.serving import EmbeddingService
from embedserve.tokenizer import Tokenized


class MultiVectorJob(Job):
    def __init__(self, svc: EmbeddingService, req: EmbeddingRequest) -> None:
        super().__init__(req.model, len(req.items))
        self.svc = svc
        self.req = req

    def tokenize(self) -> list[Tokenized]:
        svc, req = self.svc, self.req
        engine = svc.engine
        if Output.MULTIVECTOR not in engine.outputs:
            raise ApiError(
                400,
                f"model {svc.metadata.model} gives one vector per input, not multivector: serve a "
                "ColBERT directory (a multi-vector Dense head) or BGE-M3 (with its colbert_linear.pt)",
            )
        engine.renderer.check_vector_dimensions(req.dimensions)
        if req.multivector_dtype in ("int8", "uint8") and svc.calibration.ranges is not None:
            raise ApiError(
                400,
                "int8 / uint8 multi-vectors use a fixed range (--int8-scale): this server's "
                "--int8-calibration ranges are its single vectors'",
            )
        ask = Ask(
            Output.MULTIVECTOR, req.prompt_name, req.prompt, req.dimensions, req.normalize, req.priority,
            req.truncate, side=req.input_type or "document",
        )  # fmt: skip
        # text, token ids, or a multi-vector VL model's images
        self.prepared = engine.prepare(resolve_items(req.items), ask)
        check_vector_count(svc, sum(i.num_vectors for i in self.prepared.sides or []))
        return self.prepared.tokenized

    async def run(self, tokenized: list[Tokenized]) -> list[EmbeddingOutput]:
        return answers_as(await self.svc.engine.run_async(self.prepared), EmbeddingOutput)

    def body(self, done: Computed) -> Any:
        req, svc = self.req, self.svc
        kind = req.multivector_dtype
        data = []
        for i, (out, tok) in enumerate(zip(done.outputs, done.tokenized, strict=True)):
            rows = quantize(out.embedding, kind, svc.calibration) if kind != "float" else out.embedding
            data.append(
                {
                    "object": "embedding",
                    "index": i,
                    "embedding": encode_values(rows, req.encoding_format),
                    "shape": list(rows.shape),
                    "num_tokens": out.num_tokens,
                    "truncated": tok.truncated,
                }
            )
        schema_kind = multivector_type(svc.schema_type(kind))
        return {
            "object": "list",
            "data": data,
            "usage": usage(done.n_tokens),
            **svc.metadata.fields(req.dimensions or self.head().dim, self.normalize(), schema_kind),
        }

    def head(self) -> MultiVectorHead:
        head = self.svc.engine.multivector_head
        assert head is not None, "tokenize refused a model without one"
        return head

    def normalize(self) -> bool:
        """As the engine decides it: the model's, or normalized when sliced, unless asked."""
        if self.req.normalize is None:
            return self.head().normalize or self.req.dimensions is not None
        return self.req.normalize


def check_vector_count(svc: EmbeddingService, n: int) -> None:
    """413 when an answer would hold more than --max-output-vectors vectors (never cut)."""
    limit = svc.max_output_vectors
    if n > limit:
        raise ApiError(
            413,
            f"the answer would hold {n} vectors; this server answers at most {limit} per request "
            "(--max-output-vectors): send fewer or shorter inputs",
        )
