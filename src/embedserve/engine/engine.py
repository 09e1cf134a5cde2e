"""Engine: the public API. Loads a model, validates inputs, runs the loop, returns vectors."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np

from embedserve.engine.adapters import adapter_view
from embedserve.engine.builder import build_engine
from embedserve.engine.classify import ClassifyMixin
from embedserve.engine.core import Finished
from embedserve.engine.late import LateChunkingMixin
from embedserve.engine.lexical import LexicalMixin
from embedserve.engine.options import EngineOptions
from embedserve.engine.outputs import EmbeddingOutput, gather_outputs, output_of, parse_priority, wait_outputs
from embedserve.engine.prefix import PromptCacheMixin
from embedserve.engine.rerank import RerankMixin
from embedserve.tokenizer import Tokenized

__all__ = ["EmbeddingOutput", "Engine", "Inputs", "output_of"]  # the outputs' types, where callers look

# A multimodal model's items may also be an image (PIL image or PNG / JPEG / WebP bytes) or a
# list of strings and images (vision/prompt.py).
Inputs = Sequence[str] | Sequence[Sequence[int]] | str | Sequence[Any]


class Engine(RerankMixin, ClassifyMixin, LateChunkingMixin, PromptCacheMixin, LexicalMixin):
    """Every output of the loaded model (its mixins', over EngineBase), loading and lifecycle."""

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
