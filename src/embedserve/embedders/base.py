"""The vector-source contract: embed items with a prompt, describe yourself, close.

Every source (engine, http, the references) is one `VectorSource`; parity drives them in batches,
bench's library baselines behind a FIFO batcher, each with the same vectors for the same spec.
"""

from __future__ import annotations

import abc
import functools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from embedserve.embedders.errors import SourceError
from embedserve.embedders.spec import Spec
from embedserve.schema import fingerprint_model_dir


@dataclass(frozen=True)
class Parts:
    """A multimodal input: text and images (encoded PNG bytes) in order, one vector. The prompt
    is its instruction (the chat format's system message), not text put before it."""

    parts: tuple[str | bytes, ...]

    @property
    def num_images(self) -> int:
        return sum(1 for p in self.parts if isinstance(p, bytes))


# A text, raw token ids sent as they are (pure numerical parity, no prompt, no specials), or
# text + image parts (multimodal models only).
Item = str | tuple[int, ...] | Parts


class VectorSource(abc.ABC):
    kind: str = ""
    spec: str = ""  # as given, secrets removed
    model_dir: Path | None = None  # local model files, when the source has them
    max_length: int | None = None  # longest input in tokens, when known
    # Its vectors are vocabulary-wide term weights (SPLADE): parity compares their non-zero sets
    # and searches them by inner product.
    sparse: bool = False
    # Its model embeds queries and documents differently (inference-free SPLADE: queries from
    # static weights, no model): parity embeds each side of a dataset through `embed_as`.
    sided: bool = False
    batch_items: int = 32  # how many items one embed() call gets at most
    batch_tokens: int = 16384  # ... and how many padded tokens

    def take_batching(self, spec: Spec, items: int, tokens: int) -> None:
        self.batch_items = spec.int_option("batch_size", items) or items
        self.batch_tokens = spec.int_option("batch_tokens", tokens) or tokens

    @functools.cached_property
    def model_version(self) -> str:
        """The fingerprint `embedserve serve` reports for `model_dir`, computed once (it reads
        every byte). Sources without local files (http) report their server's instead."""
        assert self.model_dir is not None
        return fingerprint_model_dir(self.model_dir)

    def cache_identity(self) -> str | None:
        """What determines this source's vectors, if they may be cached (references only)."""
        return None

    @abc.abstractmethod
    def embed(self, items: Sequence[Item], prompt: str) -> np.ndarray:
        """float32 [len(items), dim] in order; `prompt` is prepended to texts (never to token ids)."""

    def embed_as(self, items: Sequence[Item], prompt: str, role: str) -> np.ndarray:
        """`embed` for one side of a dataset (`role`: "query" or "document"); a `sided` source's
        model embeds the two differently."""
        return self.embed(items, prompt)

    @abc.abstractmethod
    def describe(self) -> dict[str, Any]:
        """Everything that defines the vectors (model, version, dtype, profile, schema, config)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Free what the source holds (models, threads, connections)."""

    def describe_local(
        self, dtype: str, profile: str, schema: dict[str, Any], config: dict[str, Any]
    ) -> dict[str, Any]:
        """`describe()` of a source that reads local model files: its identity, then the
        source's own profile, schema and configuration."""
        return {
            "kind": self.kind,
            "spec": self.spec,
            "model": str(self.model_dir),
            "model_version": self.model_version,
            "dtype": dtype,
            "backend_profile": profile,
            "embedding_schema": schema,
            "config": config,
        }


def split_items(items: Sequence[Item]) -> tuple[list[str], list[list[int]]]:
    """A batch is all texts or all token ids (one dataset side never mixes them). Image parts
    belong to multimodal sources, which take items whole."""
    if any(isinstance(i, Parts) for i in items):
        raise SourceError(
            "this backend's model takes text only; the dataset has image inputs (use a multimodal model)"
        )
    texts = [i for i in items if isinstance(i, str)]
    ids = [list(i) for i in items if isinstance(i, tuple)]
    if texts and ids:
        raise ValueError("a batch mixes texts and token ids")
    return texts, ids
