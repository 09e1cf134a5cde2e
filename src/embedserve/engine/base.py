"""The engine's state and how every request is built and queued: `EngineBase`, which the
output mixins (rerank.py, classify.py, late.py, lexical.py, multivector.py, prefix.py) extend
and engine.py's `Engine` puts together."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from embedserve.engine.builder import EngineParts
from embedserve.engine.core import Finished
from embedserve.engine.loop import EngineLoop
from embedserve.engine.multimodal import tokenize_items
from embedserve.engine.outputs import parse_priority
from embedserve.engine.static import StaticQueryMixin
from embedserve.errors import InvalidInputError
from embedserve.lora.adapter import LoraAdapter
from embedserve.pooling.outputs import multivectors_only
from embedserve.pooling.state import PoolingState
from embedserve.request import EmbedParams, Request, check_dimensions
from embedserve.tokenizer import Tokenized, resolve_prompt


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
        self.adapters = self._loop.parts.adapters  # LoRA adapters (engine/adapters.py)
        self.outputs = self._loop.parts.outputs  # what the model emits (pooling/outputs.py)
        self.adapter: LoraAdapter | None = None  # this engine's requests run it (`with_adapter`)
        # What errors call the model: its directory's name, or the name a server serves it as.
        self.name = Path(self.config.model_path).name
        self._ids = itertools.count()

    def resolve_prompt(self, prompt_name: str | None, prompt: str | None) -> str:
        return resolve_prompt(self.config.prompts, self.config.default_prompt_name, prompt_name, prompt)

    def check_dimensions(self, dimensions: int | None) -> None:
        check_dimensions(dimensions, self.config.vector_size, sparse=self.sparse_head is not None)

    def tokenize(
        self, inputs: Any, prompt: str = "", truncate: str = "error", max_len: int | None = None
    ) -> list[Tokenized]:
        """Tokenize and validate every input (raises naming the first bad one); `max_len`: the
        length over which `truncate` applies (default: the model's max_model_len)."""
        limit = self.config.scheduler.max_model_len if max_len is None else max_len
        return tokenize_items(
            self._loop.parts.prompter, self.tokenizer, inputs, prompt, limit, truncate, self.name
        )

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
        self.check_dimensions(dimensions)
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

    def submit_tokenized(
        self,
        tokenized: list[Tokenized],
        *,
        dimensions: int | None = None,
        normalize: bool | None = None,
        priority: str = "online",
    ) -> list[Future[Finished]]:
        """Queue inputs `tokenize()` already produced (a server counts tokens first); options as `submit`."""
        self._check_single_vectors()  # a ColBERT model has no single vector (engine/multivector.py)
        if any(t.static for t in tokenized):  # inference-free queries: answered without the model
            return self._static_results(tokenized, normalize)
        return self._loop.submit(self._requests(tokenized, dimensions, normalize, priority))

    def _check_single_vectors(self) -> None:
        """Refuse one vector per input of a model that answers multi-vectors only (ColBERT)."""
        if multivectors_only(self.outputs):
            raise InvalidInputError(
                f"model {self.name} is a multi-vector (late-interaction) model: it answers a vector per "
                "token (embed_multivector; over HTTP embedding_type 'multivector'), not one per input"
            )
