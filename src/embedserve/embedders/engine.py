"""`engine:PATH?dtype=bfloat16&max_num_batched_tokens=512&...`: our engine, in process.

Every field of `EngineOptions` (engine/options.py) is a key, typed there; a tool's own settings
(bench's token budget) come as overrides. `open_engine` is the one place the tools (parity, bench,
rerank, index) open an engine; `EngineSource` the one adapter over it: a spec's inputs truncated
at the end, as sentence-transformers does (`embed`); index's documents and queries by prompt
name, dimensions, priority class and truncation policy (`embed_texts`); the vector metadata
computed as `embedserve serve` computes it (`metadata`). `engine` is public: bench drives it per
input, asynchronously.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from importlib.metadata import version
from pathlib import Path
from typing import Any

import numpy as np

from embedserve.embedders.base import Item, Parts, VectorSource, split_items
from embedserve.embedders.errors import SourceError
from embedserve.embedders.spec import Spec
from embedserve.engine.ask import Ask, Prepared, answers_as
from embedserve.engine.engine import Engine
from embedserve.engine.options import EngineOptions
from embedserve.engine.outputs import EmbeddingOutput
from embedserve.models.router import QUERY_PROMPT_NAME
from embedserve.pooling.outputs import Output
from embedserve.schema import ModelMetadata


def open_engine(location: str | Path, options: EngineOptions) -> Engine:
    """An engine on a model directory (or .gguf file) with typed options, a tool's own included."""
    return Engine.from_pretrained(location, options)


class EngineSource(VectorSource):
    kind = "engine"

    def __init__(self, engine: Engine, options: EngineOptions | None = None, spec: str = "") -> None:
        """`options`: those `engine` was opened with (None: a caller's engine, options unknown)."""
        self.engine = engine
        self.options = options
        self.spec = spec
        self.model_dir = Path(engine.config.model_path)
        self.max_length = engine.config.scheduler.max_model_len
        self.sparse = Output.SPARSE in engine.outputs
        # inference-free SPLADE: its queries skip the model (engine/static.py)
        self.sided = engine.renderer.routes_statically(QUERY_PROMPT_NAME)
        self.lexical = False  # `?output=lexical`: BGE-M3's lexical weights (`open`)
        self.num_preemptions = 0

    @classmethod
    def open(cls, spec: Spec, **overrides: Any) -> EngineSource:
        """The engine a spec names; `overrides`: engine options the tool sets itself."""
        options = spec.engine_options(**overrides)
        source = cls(open_engine(spec.location, options), options, spec.shown)
        source.take_batching(spec, 64, 65536)
        output = spec.option("output", "dense")
        lexical = output == Output.LEXICAL
        if output != Output.DENSE and not (lexical and Output.LEXICAL in source.engine.outputs):
            source.close()
            raise SourceError(
                f"{spec.shown}: output must be dense or lexical (a model with sparse_linear.pt)"
            )
        source.lexical = source.sparse = lexical
        return source

    def embed(self, items: Sequence[Item], prompt: str) -> np.ndarray:
        if any(isinstance(i, Parts) for i in items):
            return self._embed_parts(items, prompt)
        texts, ids = split_items(items)
        if self.lexical:  # vocabulary-wide, as the reference writes FlagEmbedding's weights out
            ask = Ask(Output.LEXICAL, prompt=prompt if texts else "", truncate="end")
            return np.stack([o.embedding for o in self._run(texts or ids, ask)])
        if texts:
            return self._stack(self._run(texts, Ask(prompt=prompt, truncate="end")))
        return self._stack(self._run(ids, Ask(truncate="end")))

    def embed_as(self, items: Sequence[Item], prompt: str, role: str) -> np.ndarray:
        if not (self.sided and role == "query"):
            return self.embed(items, prompt)
        texts, ids = split_items(items)
        if ids:
            raise SourceError(f"{self.spec}: inference-free queries are text (its static weights' tokens)")
        tokenized = self.engine.renderer.static(texts, prompt, "end")  # no engine step (engine/static.py)
        return self._stack(self._run(Prepared(Ask(), tokenized)))

    def embed_texts(
        self,
        texts: list[str],
        *,
        prompt_name: str | None,
        dimensions: int | None,
        priority: str,
        truncate: str,
    ) -> np.ndarray:
        """Texts with a prompt of the model's table (None: its default prompt), the first
        `dimensions` values, a priority class and a truncation policy (engine/ask.py's)."""
        ask = Ask(prompt_name=prompt_name, dimensions=dimensions, priority=priority, truncate=truncate)
        return self._stack(self._run(texts, ask))

    def _embed_parts(self, items: Sequence[Item], prompt: str) -> np.ndarray:
        """Text + image inputs (a multimodal model): parts in order, the prompt as instruction."""
        if not self.engine.multimodal:
            raise SourceError(
                f"{self.spec}: model {self.model_dir} takes text only; the dataset has image inputs"
            )
        inputs = [list(i.parts) if isinstance(i, Parts) else i for i in items]
        return self._stack(self._run(inputs, Ask(prompt=prompt)))

    def _run(self, inputs: Any, ask: Ask | None = None) -> list[EmbeddingOutput]:
        return answers_as(self.engine.run(inputs, ask), EmbeddingOutput)

    def _stack(self, outputs: list[EmbeddingOutput]) -> np.ndarray:
        self.num_preemptions += sum(o.num_preemptions for o in outputs)
        return np.stack([o.embedding for o in outputs]).astype(np.float32, copy=False)

    def metadata(self, name: str | None = None, model_version: str | None = None) -> ModelMetadata:
        """What `embedserve serve` reports for this model and these options (schema.py): `name` as
        served (default: the directory's), `model_version` as an operator names it (default: the
        directory's fingerprint, which enters the schema either way)."""
        fingerprint = self.model_version  # VectorSource's: the directory's, computed once
        return ModelMetadata.from_engine_config(
            self.engine.config, name or Path(self.engine.config.model_path).name, model_version, fingerprint
        )

    def describe(self) -> dict[str, Any]:
        """Metadata computed as `embedserve serve` computes it for the same model and options, so an
        http audit of a server and an in-process run of its configuration can be matched."""
        cfg = self.engine.config
        pooling = cfg.pooling
        return {
            "kind": self.kind,
            "spec": self.spec,
            **self.metadata().fields(),
            "config": {
                "model_path": cfg.model_path,
                "options": None if self.options is None else self.options.changed(),
                "model": dataclasses.asdict(cfg.model),
                "pooling": {**dataclasses.asdict(pooling), "method": pooling.method.value},
                "scheduler": dataclasses.asdict(cfg.scheduler),
                "cache": dataclasses.asdict(cfg.cache),
                "device": str(cfg.device),
                "stats": self.engine.stats(),
                "request_preemptions": self.num_preemptions,
                "batch_size": self.batch_items,
                "batch_tokens": self.batch_tokens,
                "versions": {p: version(p) for p in ("embedserve", "torch")},
            },
        }

    def close(self) -> None:
        self.engine.close()
