"""Every token's vector on the serving template: TEI's `POST /embed_all` and vLLM's `POST /pooling`
(its `embed` task is `/v1/embeddings`' work in vLLM's body; `token_embed` is `/embed_all`'s).
Each input runs as one request pooled per position (late_chunking.every_token), unnormalized."""

from __future__ import annotations

from typing import Any, Literal

from embedserve.api.protocol import ApiError
from embedserve.api.routes import EMBED_ALL, POOLING
from embedserve.api.tei import embed_vectors
from embedserve.api.token_outputs import EmbedAllRequest, PoolingRequest, pooling_body, token_vectors
from embedserve.engine.ask import Ask, Prepared, answers_as
from embedserve.engine.outputs import EmbeddingOutput
from embedserve.errors import API_REMEDY, TEI_REMEDY
from embedserve.server.embeddings_routes import EmbeddingsJob
from embedserve.server.pipeline import Computed, Job, ServerRoute
from embedserve.server.serving import EmbeddingService
from embedserve.tokenizer import Tokenized
from embedserve.tokenizer.late import every_token


class TokenVectorsJob(Job):
    """Per input, each token's final hidden state."""

    def __init__(
        self,
        svc: EmbeddingService,
        model: str | None,
        items: list[str],
        prompt_name: str | None,
        truncate: Literal["error", "end", "start"],
        remedy: str,
    ) -> None:
        super().__init__(model, len(items))
        self.svc = svc
        self.items = items
        self.prompt_name = prompt_name
        self.truncate = truncate
        self.remedy = remedy

    @property
    def truncate_remedy(self) -> str:
        return self.remedy

    def tokenize(self) -> list[Tokenized]:
        engine = self.svc.engine
        if engine.config.pooling.dense:  # Dense modules after pooling (the config says; no head probe)
            raise ApiError(
                400,
                f"model {self.svc.metadata.model} has Dense modules after pooling: its token vectors "
                "are not what it embeds, so they are not served",
            )
        render = engine.renderer
        prompt = render.prompt(self.prompt_name, None)
        return [every_token(t) for t in render.text(self.items, prompt, self.truncate)]

    async def run(self, tokenized: list[Tokenized]) -> list[EmbeddingOutput]:
        answers = await self.svc.engine.run_async(Prepared(Ask(normalize=False), tokenized))
        return answers_as(answers, EmbeddingOutput)

    def body(self, done: Computed) -> Any:
        return token_vectors([o.embedding for o in done.outputs])


def embed_all_job(svc: EmbeddingService, req: EmbedAllRequest) -> Job:
    return TokenVectorsJob(svc, req.model, req.items, req.prompt_name, req.policy, TEI_REMEDY)


class TokenPoolingJob(TokenVectorsJob):
    def body(self, done: Computed) -> Any:
        return pooling_body(self.svc.metadata.model, super().body(done), done.n_tokens)


class EmbedPoolingJob(EmbeddingsJob):
    def body(self, done: Computed) -> Any:
        return pooling_body(self.svc.metadata.model, embed_vectors(super().body(done)), done.n_tokens)


def pooling_job(svc: EmbeddingService, req: PoolingRequest) -> Job:
    if req.task == "token_embed":
        if req.dimensions is not None or req.normalize:
            raise ApiError(
                400, "task token_embed answers each token's raw vector: no dimensions or normalize"
            )
        return TokenPoolingJob(svc, req.model, req.items, req.prompt_name, req.truncate, API_REMEDY)
    return EmbedPoolingJob(svc, req.to_embedding_request())


EMBED_ALL_ROUTE = ServerRoute(EMBED_ALL, embed_all_job)
POOLING_ROUTE = ServerRoute(POOLING, pooling_job)
