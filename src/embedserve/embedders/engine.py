"""`engine:PATH?dtype=bfloat16&max_num_batched_tokens=512&...`: our engine, in process.

Every field of `EngineOptions` (engine/options.py) is a key, typed there; a tool's own settings
(bench's token budget) come as overrides. Inputs over the model's limit are truncated at the end,
as sentence-transformers does. `engine` is public: bench drives it per input, asynchronously.
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
from embedserve.engine.engine import Engine
from embedserve.schema import ModelMetadata, fingerprint_model_dir


class EngineSource(VectorSource):
    kind = "engine"

    def __init__(self, spec: Spec, **overrides: Any) -> None:
        self.spec = spec.shown
        self.model_dir = Path(spec.location)
        self.options = spec.engine_options(**overrides).changed()
        self.take_batching(spec, 64, 65536)
        self.engine = Engine.from_pretrained(spec.location, **self.options)
        self.max_length = self.engine.config.scheduler.max_model_len
        self.num_preemptions = 0

    def embed(self, items: Sequence[Item], prompt: str) -> np.ndarray:
        if any(isinstance(i, Parts) for i in items):
            return self._embed_parts(items, prompt)
        texts, ids = split_items(items)
        if texts:
            outputs = self.engine.embed_outputs(texts, prompt=prompt, truncate="end")
        else:
            outputs = self.engine.embed_outputs(ids, truncate="end")
        self.num_preemptions += sum(o.num_preemptions for o in outputs)
        return np.stack([o.embedding for o in outputs]).astype(np.float32, copy=False)

    def _embed_parts(self, items: Sequence[Item], prompt: str) -> np.ndarray:
        """Text + image inputs (a multimodal model): parts in order, the prompt as instruction."""
        if not self.engine.multimodal:
            raise SourceError(
                f"{self.spec}: model {self.model_dir} takes text only; the dataset has image inputs"
            )
        inputs = [list(i.parts) if isinstance(i, Parts) else i for i in items]
        outputs = self.engine.embed_outputs(inputs, prompt=prompt)
        self.num_preemptions += sum(o.num_preemptions for o in outputs)
        return np.stack([o.embedding for o in outputs]).astype(np.float32, copy=False)

    def describe(self) -> dict[str, Any]:
        """Metadata computed as `embedserve serve` computes it for the same model and options, so an
        http audit of a server and an in-process run of its configuration can be matched."""
        cfg = self.engine.config
        pooling = cfg.pooling
        sched = cfg.scheduler
        name = Path(cfg.model_path).name
        meta = ModelMetadata.from_engine_config(cfg, name, None, fingerprint_model_dir(cfg.model_path))
        return {
            "kind": self.kind,
            "spec": self.spec,
            **meta.fields(),
            "config": {
                "model_path": cfg.model_path,
                "options": self.options,
                "model": dataclasses.asdict(cfg.model),
                "pooling": {**dataclasses.asdict(pooling), "method": pooling.method.value},
                "scheduler": dataclasses.asdict(sched),
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
