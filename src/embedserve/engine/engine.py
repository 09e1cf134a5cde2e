"""Engine: the public API. Loads a model, validates inputs, runs the loop, returns vectors."""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np

from embedserve.engine.adapters import adapter_view
from embedserve.engine.builder import EngineParts, build_engine
from embedserve.engine.classify import ClassifyMixin
from embedserve.engine.core import Finished
from embedserve.engine.late import LateChunkingMixin
from embedserve.engine.lexical import LexicalMixin
from embedserve.engine.loop import EngineLoop
from embedserve.engine.multimodal import tokenize_items
from embedserve.engine.multivector import MultiVectorMixin
from embedserve.engine.options import EngineOptions
from embedserve.engine.outputs import EmbeddingOutput, gather_outputs, output_of, parse_priority, wait_outputs
from embedserve.engine.prefix import PromptCacheMixin
from embedserve.engine.rerank import RerankMixin
from embedserve.engine.static import StaticQueryMixin
from embedserve.lora.adapter import LoraAdapter
from embedserve.request import EmbedParams, Request, check_dimensions
from embedserve.tokenizer import Tokenized, resolve_prompt

__all__ = ["EmbeddingOutput", "Engine", "Inputs", "output_of"]  # the outputs' types, where callers look

# A multimodal model's items may also be an image (PIL image or PNG / JPEG / WebP bytes) or a
# list of strings and images (vision/prompt.py).
Inputs = Sequence[str] | Sequence[Sequence[int]] | str | Sequence[Any]


class Engine(RerankMixin, ClassifyMixin, LateChunkingMixin, PromptCacheMixin, StaticQueryMixin, LexicalMixin, MultiVectorMixin):  # noqa: E501  # fmt: skip
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

    # ---- construction ----------------------------------------------------------------------

    @classmethod
    def from_pretrained(
        cls, path: str | Path, options: EngineOptions | None = None, **overrides: Any
    ) -> Engine:
        """Load a model directory with `options` (engine/options.py: dtype, device, token budget,
        ...), any field also given as a keyword. The model is loaded on the engine loop's thread."""
        options = (options or EngineOptions()).replace(**overrides)  # an unknown keyword fails here
        return cls(functools.partial(build_engine, path, options))

    def with_adapter(self, name: str) -> Engine:
        """This engine with its requests run by LoRA adapter `name` (the same loop and queue)."""
        return adapter_view(self, name)

    # ---- input handling --------------------------------------------------------------------

    def resolve_prompt(self, prompt_name: str | None, prompt: str | None) -> str:
        return resolve_prompt(self.config.prompts, self.config.default_prompt_name, prompt_name, prompt)

    def check_dimensions(self, dimensions: int | None) -> None:
        check_dimensions(dimensions, self.config.vector_size, sparse=self.sparse_head is not None)

    def tokenize(
        self, inputs: Inputs, prompt: str = "", truncate: str = "error", max_len: int | None = None
    ) -> list[Tokenized]:
        """Tokenize and validate every input (raises naming the first bad one); `max_len`: the
        length over which `truncate` applies (default: the model's max_model_len)."""
        limit = self.config.scheduler.max_model_len if max_len is None else max_len
        return tokenize_items(
            self._loop.parts.prompter, self.tokenizer, inputs, prompt, limit, truncate, self.name
        )

    def _requests(
        self, tokenized: list[Tokenized], dimensions: int | None, normalize: bool | None, priority: str
    ) -> list[Request]:
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
            )
            for t in tokenized
        ]

    # ---- embedding API ---------------------------------------------------------------------

    def submit(
        self,
        inputs: Inputs,
        *,
        prompt_name: str | None = None,
        prompt: str | None = None,
        dimensions: int | None = None,
        normalize: bool | None = None,
        priority: str = "online",
        truncate: str = "error",
    ) -> tuple[list[Future[Finished]], list[Tokenized]]:
        """Validate every input first (all or nothing, InvalidInputError naming the first bad
        one), then queue each; returns one future per input and the inputs as tokenized.

        `inputs`: a string, a list of strings, or a list of token-id lists. The options, the
        same for every `embed*` method:

        - `prompt_name`: a prompt of the model's table (`config_sentence_transformers.json`),
          e.g. "query"; `prompt`: literal text put before each input instead (not both).
          Neither: the model's default prompt, if any. Token-id inputs take no prompt (pass
          `prompt=""` where the model has a default one).
        - `dimensions`: keep the first `dimensions` values (Matryoshka), then normalize.
        - `normalize`: L2-normalize the vector; None is the model's pooling config.
        - `priority`: "online" (latency) or "batch" (throughput; yields to online work).
        - `truncate`: "error" (an input over the model's limit is refused), "end" or "start"
          (cut that end of the text, keeping the EOS token).
        """
        self.check_dimensions(dimensions)
        parse_priority(priority)
        text_prompt = self.resolve_prompt(prompt_name, prompt)
        static = self.routes_statically(prompt_name)  # inference-free SPLADE's queries (engine/static.py)
        tokenized = (self.tokenize_static if static else self.tokenize)(inputs, text_prompt, truncate)
        return self.submit_tokenized(
            tokenized, dimensions=dimensions, normalize=normalize, priority=priority
        ), tokenized

    def submit_tokenized(
        self,
        tokenized: list[Tokenized],
        *,
        dimensions: int | None = None,
        normalize: bool | None = None,
        priority: str = "online",
    ) -> list[Future[Finished]]:
        """Queue inputs `tokenize()` already produced (a server counts tokens first); options as `submit`."""
        self.check_single_vectors()  # a ColBERT model has no single vector (engine/multivector.py)
        if any(t.static for t in tokenized):  # inference-free queries: answered without the model
            return self.static_results(tokenized, normalize)
        return self._loop.submit(self._requests(tokenized, dimensions, normalize, priority))

    def embed_outputs(
        self,
        inputs: Inputs,
        *,
        prompt_name: str | None = None,
        prompt: str | None = None,
        dimensions: int | None = None,
        normalize: bool | None = None,
        priority: str = "online",
        truncate: str = "error",
    ) -> list[EmbeddingOutput]:
        """`embed` with each vector's token count, truncation and timings; options as `submit`."""
        futures, tokenized = self.submit(
            inputs,
            prompt_name=prompt_name,
            prompt=prompt,
            dimensions=dimensions,
            normalize=normalize,
            priority=priority,
            truncate=truncate,
        )
        return wait_outputs(futures, tokenized)

    def embed(
        self,
        inputs: Inputs,
        *,
        prompt_name: str | None = None,
        prompt: str | None = None,
        dimensions: int | None = None,
        normalize: bool | None = None,
        priority: str = "online",
        truncate: str = "error",
    ) -> np.ndarray:
        """Embed strings or token-id lists; returns float32 [len(inputs), dim] in input order.
        Options as `submit`."""
        outputs = self.embed_outputs(
            inputs,
            prompt_name=prompt_name,
            prompt=prompt,
            dimensions=dimensions,
            normalize=normalize,
            priority=priority,
            truncate=truncate,
        )
        return np.stack([o.embedding for o in outputs])

    async def embed_outputs_async(
        self,
        inputs: Inputs,
        *,
        prompt_name: str | None = None,
        prompt: str | None = None,
        dimensions: int | None = None,
        normalize: bool | None = None,
        priority: str = "online",
        truncate: str = "error",
    ) -> list[EmbeddingOutput]:
        """`embed_outputs`, awaited (cancelling it frees the queued inputs); options as `submit`."""
        futures, tokenized = self.submit(
            inputs,
            prompt_name=prompt_name,
            prompt=prompt,
            dimensions=dimensions,
            normalize=normalize,
            priority=priority,
            truncate=truncate,
        )
        return await gather_outputs(futures, tokenized)

    async def embed_tokenized_async(
        self,
        tokenized: list[Tokenized],
        *,
        dimensions: int | None = None,
        normalize: bool | None = None,
        priority: str = "online",
    ) -> list[EmbeddingOutput]:
        """`submit_tokenized`, awaited; options as `submit` (those after tokenizing)."""
        futures = self.submit_tokenized(
            tokenized, dimensions=dimensions, normalize=normalize, priority=priority
        )
        return await gather_outputs(futures, tokenized)

    async def embed_async(
        self,
        inputs: Inputs,
        *,
        prompt_name: str | None = None,
        prompt: str | None = None,
        dimensions: int | None = None,
        normalize: bool | None = None,
        priority: str = "online",
        truncate: str = "error",
    ) -> np.ndarray:
        """`embed`, awaited; options as `submit`."""
        outputs = await self.embed_outputs_async(
            inputs,
            prompt_name=prompt_name,
            prompt=prompt,
            dimensions=dimensions,
            normalize=normalize,
            priority=priority,
            truncate=truncate,
        )
        return np.stack([o.embedding for o in outputs])

    # ---- introspection and lifecycle -------------------------------------------------------

    def stats(self) -> dict[str, int]:
        return self._loop.stats()

    @property
    def alive(self) -> bool:
        return self._loop.alive

    def close(self) -> None:
        self._loop.stop()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
