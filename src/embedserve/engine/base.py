"""The engine's state and how every request is built and queued: `EngineBase`, which the
output mixins (late.py, lexical.py, multivector.py, prefix.py) extend and engine.py's `Engine`
puts together behind its one submit path."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from pathlib import Path

from embedserve.engine.builder import EngineParts
from embedserve.engine.core import Finished
from embedserve.engine.loop import EngineLoop
from embedserve.engine.outputs import parse_priority
from embedserve.engine.static import StaticQueryMixin
from embedserve.errors import InvalidInputError
from embedserve.lora.adapter import LoraAdapter
from embedserve.pooling.outputs import multivectors_only
from embedserve.pooling.state import PoolingState
from embedserve.request import EmbedParams, Request
from embedserve.tokenizer import Tokenized
from embedserve.tokenizer.render_sides import Renderer


class EngineBase(StaticQueryMixin):
    def __init__(self, parts: EngineParts | Callable[[], EngineParts]) -> None:
        """Run built `parts`, or build them with `parts()` on the engine loop's thread: the
        thread that then runs the model (loop.py: one OpenMP pool, not two)."""
        self._loop = EngineLoop(parts if callable(parts) else lambda: parts)
        self.config = self._loop.parts.config
        self.tokenizer = self._loop.parts.tokenizer
        self.score_head = self._loop.parts.score_head  # rerankers, classifiers (rerank.py, classify.py)
        self.sparse_head = self._loop.parts.sparse_head  # SPLADE: term weights over the vocabulary
        self.multimodal = self._loop.parts.prompter is not None  # takes image parts
        self.static_queries = self._loop.parts.static_queries  # inference-free SPLADE (engine/static.py)
        self.lexical_head = self._loop.parts.lexical_head  # BGE-M3's sparse vectors (engine/lexical.py)
        self.dense_head = self._loop.parts.dense_head  # sentence-transformers Dense modules
        # ColBERT's token head, BGE-M3's colbert_linear: a vector per token (engine/multivector.py)
        self.multivector_head = self._loop.parts.multivector_head
        self.adapters = self._loop.parts.adapters  # LoRA adapters (engine/adapters.py)
        self.outputs = self._loop.parts.outputs  # what the model emits (pooling/outputs.py)
        self.adapter: LoraAdapter | None = None  # this engine's requests run it (`with_adapter`)
        # What errors call the model: its directory's name, or the name a server serves it as.
        self.name = Path(self.config.model_path).name
        self._render_spec = self._loop.parts.render_spec()
        self._ids = itertools.count()

    @property
    def renderer(self) -> Renderer:
        """The model's inputs as it reads them (tokenizer/render.py); errors name this engine's model."""
        return Renderer(self._render_spec, self.name)

    def _check_dimensions(self, dimensions: int | None) -> None:
        self.renderer.check_dimensions(dimensions)

    def _requests(
        self,
        tokenized: list[Tokenized],
        dimensions: int | None,
        normalize: bool | None,
        priority: str,
        states: Sequence[PoolingState] | None = None,
        attend_keys: Sequence[int | None] | None = None,
    ) -> list[Request]:
        """Validated requests for `tokenized`; `states`: each one's pooling state where the
        caller chose it (multi-vector, lexical), `attend_keys` its query-only positions."""
        self._check_dimensions(dimensions)
        prio = parse_priority(priority)
        pool = self.config.pooling
        norm = pool.normalize if normalize is None else normalize
        params = EmbedParams(dimensions=dimensions, normalize=norm, dense=self.dense_head)
        core = self._loop.core
        for t in tokenized:
            core.check_admissible(len(t.token_ids))
            if t.multimodal is not None:  # a step holds a whole image
                core.scheduler.check_images(max(s.image.num_tokens for s in t.multimodal.spans))
        return [
            Request(
                next(self._ids),
                t.token_ids,
                params,
                pool.method,
                prio,
                excluded_prefix=0 if pool.include_prompt else t.prompt_tokens,
                token_type_ids=t.token_type_ids,
                multimodal=t.multimodal,
                deterministic_chunk=self.config.scheduler.deterministic_chunk,
                sparse_head=self.sparse_head,
                late=t.late,
                adapter=self.adapter,
                attend_keys=None if attend_keys is None else attend_keys[i],
                state=None if states is None else states[i],
            )
            for i, t in enumerate(tokenized)
        ]

    def _submit_tokenized(
        self,
        tokenized: list[Tokenized],
        *,
        dimensions: int | None = None,
        normalize: bool | None = None,
        priority: str = "online",
    ) -> list[Future[Finished]]:
        """Queue rendered inputs, one request each (one vector each: an embedding, a pair's or a
        classified input's pooled row, a late-chunked window's span rows)."""
        self._check_single_vectors()  # a ColBERT model has no single vector (engine/multivector.py)
        if any(t.static for t in tokenized):  # inference-free queries: answered without the model
            return self._static_results(tokenized, normalize)
        return self._loop.submit(self._requests(tokenized, dimensions, normalize, priority))

    def _check_single_vectors(self) -> None:
        """Refuse one vector per input of a model that answers multi-vectors only (ColBERT)."""
        if multivectors_only(self.outputs):
            raise InvalidInputError(
                f"model {self.name} is a multi-vector (late-interaction) model: it answers a vector per "
                "token (Ask(Output.MULTIVECTOR); over HTTP embedding_type 'multivector'), not one per input"
            )
